//! COM1, a 16550 UART from vm-superio. Its interrupt line is an eventfd bound to GSI 4 of the
//! in-kernel irqchip; its output goes to emon's stdout or a file.
use std::io::Write;
use vmm_sys_util::eventfd::EventFd;

pub const COM1: u16 = 0x3F8;
pub const COM1_END: u16 = 0x3FF;
pub const COM1_IRQ: u32 = 4;

/// vm-superio's interrupt trigger, as an irqfd.
pub struct IrqTrigger(pub EventFd);

impl vm_superio::Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub type Output = Box<dyn Write + Send>;

/// What a Linux kernel prints first when it panics.
pub const PANIC_MARK: &str = "Kernel panic - not syncing:";
/// Console line bytes kept while looking for [`PANIC_MARK`] (a longer line is cut there).
const LINE_MAX: usize = 512;

/// The guest's output on its way out, watched line by line for a kernel panic.
pub struct Watched {
    out: Output,
    line: Vec<u8>,
    /// The first line with [`PANIC_MARK`], from the mark on.
    pub panic: Option<String>,
}

impl Watched {
    fn new(out: Output) -> Watched {
        Watched { out, line: Vec::new(), panic: None }
    }

    fn see(&mut self, buf: &[u8]) {
        for &b in buf {
            if b == b'\n' {
                if self.panic.is_none() {
                    let line = String::from_utf8_lossy(&self.line);
                    if let Some(at) = line.find(PANIC_MARK) {
                        self.panic = Some(line[at..].trim_end().to_string());
                    }
                }
                self.line.clear();
            } else if self.line.len() < LINE_MAX {
                self.line.push(b);
            }
        }
    }
}

impl Write for Watched {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.see(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

pub struct SerialPort {
    uart: vm_superio::Serial<IrqTrigger, vm_superio::serial::NoEvents, Watched>,
    /// Set when the output could not be written; reported once at the end of the run.
    pub output_error: Option<String>,
}

impl SerialPort {
    pub fn new(trigger: IrqTrigger, out: Output) -> Self {
        SerialPort { uart: vm_superio::Serial::new(trigger, Watched::new(out)), output_error: None }
    }

    /// The guest kernel's panic line, if it printed one.
    pub fn panic_line(&self) -> Option<&str> {
        self.uart.writer().panic.as_deref()
    }

    pub fn write(&mut self, offset: u16, data: &[u8]) {
        for &b in data {
            if let Err(e) = self.uart.write(offset as u8, b) {
                self.output_error.get_or_insert_with(|| format!("{e:?}"));
            }
        }
    }

    pub fn read(&mut self, offset: u16, data: &mut [u8]) {
        for b in data.iter_mut() {
            *b = self.uart.read(offset as u8);
        }
    }

    pub fn flush(&mut self) {
        if let Err(e) = self.uart.writer_mut().flush() {
            self.output_error.get_or_insert_with(|| e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_panic_line_is_kept_from_its_mark_on() {
        let mut w = Watched::new(Box::new(std::io::sink()));
        w.write_all(b"[    1.0] Run /sbin/init\n[   14.2] Kernel panic - not syncing: No working init found.  \r\n")
            .unwrap();
        w.write_all(b"[   14.3] Kernel panic - not syncing: another\n").unwrap();
        assert_eq!(w.panic.as_deref(), Some("Kernel panic - not syncing: No working init found."));
        let mut w = Watched::new(Box::new(std::io::sink()));
        w.write_all(&[b'x'; 4096]).unwrap();
        w.write_all(b"\nno panic here\n").unwrap();
        assert_eq!(w.panic, None);
    }
}
