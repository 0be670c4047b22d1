//! COM1, a 16550 UART from vm-superio. Its interrupt line is an eventfd bound to GSI 4 of the
//! in-kernel irqchip; its output goes to emon's stdout or a file, watched for a Linux kernel's
//! panic and the end of it ([`ConsoleWatch`]).
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
/// What Linux 6.1's `panic()` prints last when it will not reboot (`panic=0`, the default of a
/// kernel built without CONFIG_PANIC_TIMEOUT): `---[ end Kernel panic - not syncing: ... ]---`.
/// After it the kernel suppresses printk and spins with preemption off, forever.
pub const PANIC_END_MARK: &str = "---[ end Kernel panic - not syncing:";
/// Console line bytes kept while looking for [`PANIC_MARK`] (a longer line is cut there).
const LINE_MAX: usize = 512;

/// What the supervisor thread watches on the console while the vCPU thread writes it: the bytes
/// written so far, and `panic_end`, written once when a line holds [`PANIC_END_MARK`] after a
/// panic line.
pub struct ConsoleWatch {
    pub bytes: AtomicU64,
    pub panic_end: EventFd,
}

/// The guest's output on its way out, watched line by line for a kernel panic.
pub struct Watched {
    out: Output,
    line: Vec<u8>,
    /// The first line with [`PANIC_MARK`], from the mark on.
    pub panic: Option<String>,
    /// The panic's end marker was seen (and `watch.panic_end` written).
    panic_ended: bool,
    watch: Arc<ConsoleWatch>,
}

impl Watched {
    fn new(out: Output, watch: Arc<ConsoleWatch>) -> Watched {
        Watched { out, line: Vec::new(), panic: None, panic_ended: false, watch }
    }

    fn see(&mut self, buf: &[u8]) {
        self.watch.bytes.fetch_add(buf.len() as u64, Ordering::SeqCst);
        for &b in buf {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line);
                // The end marker holds PANIC_MARK too: it ends a panic, it does not start one.
                if line.contains(PANIC_END_MARK) {
                    if self.panic.is_some() && !self.panic_ended {
                        self.panic_ended = true;
                        // A failed write only leaves the run to end as before (reset, timeout).
                        let _ = self.watch.panic_end.write(1);
                    }
                } else if self.panic.is_none() {
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
    pub fn new(trigger: IrqTrigger, out: Output) -> std::io::Result<Self> {
        let watch = Arc::new(ConsoleWatch { bytes: AtomicU64::new(0), panic_end: EventFd::new(libc::EFD_NONBLOCK)? });
        Ok(SerialPort { uart: vm_superio::Serial::new(trigger, Watched::new(out, watch)), output_error: None })
    }

    /// The guest kernel's panic line, if it printed one.
    pub fn panic_line(&self) -> Option<&str> {
        self.uart.writer().panic.as_deref()
    }

    /// What the supervisor watches on this console.
    pub fn watch(&self) -> Arc<ConsoleWatch> {
        self.uart.writer().watch.clone()
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

    fn watched() -> Watched {
        let watch =
            Arc::new(ConsoleWatch { bytes: AtomicU64::new(0), panic_end: EventFd::new(libc::EFD_NONBLOCK).unwrap() });
        Watched::new(Box::new(std::io::sink()), watch)
    }

    #[test]
    fn the_first_panic_line_is_kept_from_its_mark_on() {
        let mut w = watched();
        w.write_all(b"[    1.0] Run /sbin/init\n[   14.2] Kernel panic - not syncing: No working init found.  \r\n")
            .unwrap();
        w.write_all(b"[   14.3] Kernel panic - not syncing: another\n").unwrap();
        assert_eq!(w.panic.as_deref(), Some("Kernel panic - not syncing: No working init found."));
        let mut w = watched();
        w.write_all(&[b'x'; 4096]).unwrap();
        w.write_all(b"\nno panic here\n").unwrap();
        assert_eq!(w.panic, None);
        assert_eq!(w.watch.bytes.load(Ordering::SeqCst), 4096 + 15);
    }

    /// The end marker is signalled once, and only after a panic line; every byte is counted.
    #[test]
    fn the_panic_end_marker_is_signalled_once_after_a_panic() {
        let mut w = watched();
        w.write_all(b"---[ end Kernel panic - not syncing: no panic before it ]---\n").unwrap();
        assert!(w.watch.panic_end.read().is_err(), "no panic yet: nothing signalled");
        assert_eq!(w.panic, None, "the end marker is not a panic line");
        w.write_all(b"[ 2.0] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\n").unwrap();
        assert!(w.watch.panic_end.read().is_err(), "the panic line alone is not its end");
        w.write_all(b"[ 2.1] ---[ end Kernel panic - not syncing: Attempted to kill init! ").unwrap();
        assert!(w.watch.panic_end.read().is_err(), "a line ends at its newline");
        w.write_all(b"exitcode=0x00000100 ]---\r\n[ 2.2] ---[ end Kernel panic - not syncing: again ]---\n").unwrap();
        assert_eq!(w.watch.panic_end.read().unwrap(), 1, "signalled once");
        assert!(w.watch.panic_end.read().is_err());
    }
}
