//! A QEMU-compatible fw_cfg device (docs/specs/fw_cfg.rst in QEMU), traditional I/O interface:
//! a 16-bit selector at 0x510 and a byte-wide data port at 0x511. It carries the entries
//! standard test kernels (kvm-unit-tests and others) read at start-up.
use std::collections::BTreeMap;

pub const SELECTOR_PORT: u16 = 0x510;
pub const DATA_PORT: u16 = 0x511;

pub const FW_CFG_SIGNATURE: u16 = 0x00;
pub const FW_CFG_ID: u16 = 0x01;
pub const FW_CFG_RAM_SIZE: u16 = 0x03;
pub const FW_CFG_NOGRAPHIC: u16 = 0x04;
pub const FW_CFG_NB_CPUS: u16 = 0x05;
pub const FW_CFG_MAX_CPUS: u16 = 0x0F;
pub const FW_CFG_CMDLINE_SIZE: u16 = 0x14;
pub const FW_CFG_CMDLINE_DATA: u16 = 0x15;
pub const FW_CFG_FILE_DIR: u16 = 0x19;

pub struct FwCfg {
    items: BTreeMap<u16, Vec<u8>>,
    selected: u16,
    offset: usize,
}

impl FwCfg {
    pub fn new(ram_size: u64, cpus: u16, cmdline: &str) -> Self {
        let mut items = BTreeMap::new();
        items.insert(FW_CFG_SIGNATURE, b"QEMU".to_vec());
        items.insert(FW_CFG_ID, 1u32.to_le_bytes().to_vec()); // bit 0: traditional interface
        items.insert(FW_CFG_RAM_SIZE, ram_size.to_le_bytes().to_vec());
        items.insert(FW_CFG_NOGRAPHIC, 1u16.to_le_bytes().to_vec());
        items.insert(FW_CFG_NB_CPUS, cpus.to_le_bytes().to_vec());
        items.insert(FW_CFG_MAX_CPUS, cpus.to_le_bytes().to_vec());
        let mut c = cmdline.as_bytes().to_vec();
        c.push(0);
        items.insert(FW_CFG_CMDLINE_SIZE, (c.len() as u32).to_le_bytes().to_vec());
        items.insert(FW_CFG_CMDLINE_DATA, c);
        items.insert(FW_CFG_FILE_DIR, 0u32.to_be_bytes().to_vec()); // no files
        FwCfg { items, selected: 0, offset: 0 }
    }

    pub fn write(&mut self, port: u16, data: &[u8]) {
        if port == SELECTOR_PORT {
            self.selected = data.iter().rev().fold(0, |acc, &b| (acc << 8) | b as u16);
            self.offset = 0;
        }
        // Writes to the data port are ignored, as in QEMU 2.4+.
    }

    pub fn read(&mut self, port: u16, data: &mut [u8]) {
        if port != DATA_PORT {
            data.fill(0);
            return;
        }
        let item = self.items.get(&self.selected).map(Vec::as_slice).unwrap_or(&[]);
        for b in data.iter_mut() {
            *b = item.get(self.offset).copied().unwrap_or(0);
            self.offset += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_item(f: &mut FwCfg, key: u16, len: usize) -> Vec<u8> {
        f.write(SELECTOR_PORT, &key.to_le_bytes());
        (0..len)
            .map(|_| {
                let mut b = [0];
                f.read(DATA_PORT, &mut b);
                b[0]
            })
            .collect()
    }

    #[test]
    fn reads_signature_cpus_and_ram_size() {
        let mut f = FwCfg::new(64 << 20, 1, "x");
        assert_eq!(read_item(&mut f, FW_CFG_SIGNATURE, 4), b"QEMU");
        assert_eq!(read_item(&mut f, FW_CFG_NB_CPUS, 2), [1, 0]);
        assert_eq!(read_item(&mut f, FW_CFG_MAX_CPUS, 2), [1, 0]);
        assert_eq!(read_item(&mut f, FW_CFG_RAM_SIZE, 8), (64u64 << 20).to_le_bytes());
    }

    #[test]
    fn selecting_rewinds_and_reading_past_the_end_gives_zero() {
        let mut f = FwCfg::new(1 << 20, 1, "");
        assert_eq!(read_item(&mut f, FW_CFG_SIGNATURE, 6), [b'Q', b'E', b'M', b'U', 0, 0]);
        assert_eq!(read_item(&mut f, FW_CFG_SIGNATURE, 2), b"QE");
        assert_eq!(read_item(&mut f, 0x7777, 2), [0, 0]);
    }
}
