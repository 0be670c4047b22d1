//! Port-I/O devices and the bus that routes guest IN/OUT to them.
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
}

/// Routes port I/O: COM1, the debug-exit port, fw_cfg; everything else reads as all-ones and
/// ignores writes, counted per port for `--verbose`.
pub struct PioBus {
    pub serial: serial::SerialPort,
    pub fw_cfg: fw_cfg::FwCfg,
    pub unhandled: BTreeMap<u16, u64>,
}

impl PioBus {
    pub fn new(serial: serial::SerialPort, fw_cfg: fw_cfg::FwCfg) -> Self {
        PioBus { serial, fw_cfg, unhandled: BTreeMap::new() }
    }

    pub fn write(&mut self, port: u16, data: &[u8]) -> PioAction {
        match port {
            serial::COM1..=serial::COM1_END => self.serial.write(port - serial::COM1, data),
            debug_exit::PORT => return PioAction::Exit(debug_exit::code(data)),
            fw_cfg::SELECTOR_PORT | fw_cfg::DATA_PORT => self.fw_cfg.write(port, data),
            _ => *self.unhandled.entry(port).or_default() += 1,
        }
        PioAction::Continue
    }

    pub fn read(&mut self, port: u16, data: &mut [u8]) {
        match port {
            serial::COM1..=serial::COM1_END => self.serial.read(port - serial::COM1, data),
            fw_cfg::SELECTOR_PORT | fw_cfg::DATA_PORT => self.fw_cfg.read(port, data),
            _ => {
                data.fill(0xFF);
                *self.unhandled.entry(port).or_default() += 1;
            }
        }
    }
}
