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

pub struct SerialPort {
    uart: vm_superio::Serial<IrqTrigger, vm_superio::serial::NoEvents, Output>,
    /// Set when the output could not be written; reported once at the end of the run.
    pub output_error: Option<String>,
}

impl SerialPort {
    pub fn new(trigger: IrqTrigger, out: Output) -> Self {
        SerialPort { uart: vm_superio::Serial::new(trigger, out), output_error: None }
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
