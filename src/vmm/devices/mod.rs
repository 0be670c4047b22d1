//! Port-I/O devices and the bus that routes guest IN/OUT to them.
pub mod cmos;
pub mod debug_exit;
pub mod fw_cfg;
pub mod serial;

use std::collections::BTreeMap;

/// What the vCPU loop does after a port access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PioAction {
    Continue,
    /// The guest wrote its exit code to the debug-exit port.
    Exit(u32),
    /// The guest reset the machine through the i8042 keyboard controller.
    Reset,
}

/// The i8042's reset line (vm-superio raises it for command 0xFE).
#[derive(Debug, Default)]
pub struct ResetLine(std::cell::Cell<bool>);

impl vm_superio::Trigger for ResetLine {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.set(true);
        Ok(())
    }
}

/// The i8042 keyboard controller's data and command/status ports.
pub const I8042_DATA: u16 = 0x60;
pub const I8042_COMMAND: u16 = 0x64;

/// Routes port I/O: COM1, the debug-exit port, fw_cfg, the i8042 (its reset command; it has no
/// keyboard: status and data read 0), the real-time clock and CMOS RAM; everything else reads as all-ones and ignores writes,
/// counted per port for `--verbose`.
pub struct PioBus {
    pub serial: serial::SerialPort,
    pub fw_cfg: fw_cfg::FwCfg,
    i8042: vm_superio::I8042Device<ResetLine>,
    cmos: cmos::Cmos,
    pub unhandled: BTreeMap<u16, u64>,
}

impl PioBus {
    pub fn new(serial: serial::SerialPort, fw_cfg: fw_cfg::FwCfg) -> Self {
        PioBus {
            serial,
            fw_cfg,
            i8042: vm_superio::I8042Device::new(ResetLine::default()),
            cmos: cmos::Cmos::default(),
            unhandled: BTreeMap::new(),
        }
    }

    pub fn write(&mut self, port: u16, data: &[u8]) -> PioAction {
        match port {
            serial::COM1..=serial::COM1_END => self.serial.write(port - serial::COM1, data),
            debug_exit::PORT => return PioAction::Exit(debug_exit::code(data)),
            fw_cfg::SELECTOR_PORT | fw_cfg::DATA_PORT => self.fw_cfg.write(port, data),
            I8042_DATA | I8042_COMMAND => {
                let Ok(()) = self.i8042.write((port - I8042_DATA) as u8, data.first().copied().unwrap_or(0));
                if self.i8042.reset_evt().0.get() {
                    return PioAction::Reset;
                }
            }
            cmos::INDEX_PORT | cmos::DATA_PORT => self.cmos.write(port, data.first().copied().unwrap_or(0)),
            _ => *self.unhandled.entry(port).or_default() += 1,
        }
        PioAction::Continue
    }

    pub fn read(&mut self, port: u16, data: &mut [u8]) {
        match port {
            serial::COM1..=serial::COM1_END => self.serial.read(port - serial::COM1, data),
            fw_cfg::SELECTOR_PORT | fw_cfg::DATA_PORT => self.fw_cfg.read(port, data),
            I8042_DATA | I8042_COMMAND => data.fill(self.i8042.read((port - I8042_DATA) as u8)),
            cmos::INDEX_PORT | cmos::DATA_PORT => data.fill(self.cmos.read(port)),
            _ => {
                data.fill(0xFF);
                *self.unhandled.entry(port).or_default() += 1;
            }
        }
    }
}

/// The bus as the precise backend completes IN and OUT without KVM.
impl crate::backend::Ports for PioBus {
    /// Whether `port` is one of emon's devices whose accesses have no effect beyond the device
    /// (a backend may then complete an IN or OUT of it without KVM): COM1, fw_cfg and the CMOS.
    /// The debug-exit port and the i8042 (its reset) end the run; every other port may be one of
    /// KVM's in-kernel devices (the PIC, the PIT), which emon cannot reach.
    fn completes(&self, port: u16) -> bool {
        matches!(
            port,
            serial::COM1
                ..=serial::COM1_END | fw_cfg::SELECTOR_PORT | fw_cfg::DATA_PORT | cmos::INDEX_PORT | cmos::DATA_PORT
        )
    }

    fn read(&mut self, port: u16, data: &mut [u8]) {
        PioBus::read(self, port, data);
    }

    fn write(&mut self, port: u16, data: &[u8]) {
        let action = PioBus::write(self, port, data);
        debug_assert_eq!(action, PioAction::Continue, "port {port:#x} completes with no effect beyond its device");
    }
}
