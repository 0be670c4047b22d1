//! The PC's real-time clock and CMOS RAM (a Motorola MC146818 at ports 0x70 and 0x71): the
//! clock reads the host's UTC time, its update cycle never shows as in progress, and the rest of
//! the 128 bytes is RAM. Without it, every read gave all-ones, "update in progress" never ended,
//! and Linux polled the clock 10,000 times at boot before giving up on it.
use time::OffsetDateTime;

/// The index port (bit 7: NMI disable, which this machine ignores) and the data port.
pub const INDEX_PORT: u16 = 0x70;
pub const DATA_PORT: u16 = 0x71;

// The MC146818's registers (its data sheet, "Address Map"), and the PC's century byte.
const SECONDS: u8 = 0x00;
const MINUTES: u8 = 0x02;
const HOURS: u8 = 0x04;
const DAY_OF_WEEK: u8 = 0x06;
const DAY_OF_MONTH: u8 = 0x07;
const MONTH: u8 = 0x08;
const YEAR: u8 = 0x09;
const REG_A: u8 = 0x0A;
const REG_B: u8 = 0x0B;
const REG_C: u8 = 0x0C;
const REG_D: u8 = 0x0D;
const CENTURY: u8 = 0x32;

/// Register A: UIP (bit 7, an update in progress) reads 0; the divider (bits 6-4) runs from the
/// 32.768 kHz time base (010) with a 1,024 Hz periodic rate (0110), as a PC's firmware leaves it.
const REG_A_RESET: u8 = 0x26;
const REG_A_UIP: u8 = 1 << 7;
/// Register B: 24-hour mode (bit 1), BCD (DM, bit 2, clear), no interrupts.
const REG_B_RESET: u8 = 0x02;
const REG_B_24H: u8 = 1 << 1;
const REG_B_BINARY: u8 = 1 << 2;
/// Register D: VRT (bit 7), the RAM and time are valid.
const REG_D_VRT: u8 = 1 << 7;

/// The clock and the CMOS RAM.
pub struct Cmos {
    index: u8,
    ram: [u8; 128],
}

impl Default for Cmos {
    fn default() -> Self {
        let mut ram = [0; 128];
        ram[REG_A as usize] = REG_A_RESET;
        ram[REG_B as usize] = REG_B_RESET;
        Cmos { index: 0, ram }
    }
}

impl Cmos {
    pub fn write(&mut self, port: u16, value: u8) {
        if port == INDEX_PORT {
            self.index = value & 0x7F;
            return;
        }
        match self.index {
            // The clock follows the host's; the guest cannot set it. C and D are read-only.
            SECONDS | MINUTES | HOURS | DAY_OF_WEEK | DAY_OF_MONTH | MONTH | YEAR | CENTURY | REG_C | REG_D => {}
            REG_A => self.ram[REG_A as usize] = value & !REG_A_UIP,
            i => self.ram[i as usize] = value,
        }
    }

    pub fn read(&mut self, port: u16) -> u8 {
        if port == INDEX_PORT {
            // The index register is write-only: the bus reads all-ones.
            return 0xFF;
        }
        self.read_at(OffsetDateTime::now_utc())
    }

    /// The selected register with the clock at `now`.
    fn read_at(&self, now: OffsetDateTime) -> u8 {
        let b = self.ram[REG_B as usize];
        let encode = |v: u8| if b & REG_B_BINARY != 0 { v } else { ((v / 10) << 4) | (v % 10) };
        match self.index {
            SECONDS => encode(now.second()),
            MINUTES => encode(now.minute()),
            HOURS if b & REG_B_24H != 0 => encode(now.hour()),
            // 12-hour mode: 12, 1, ..., 11, with bit 7 for PM.
            HOURS => {
                let h = now.hour();
                let pm = if h >= 12 { 0x80 } else { 0 };
                encode(if h % 12 == 0 { 12 } else { h % 12 }) | pm
            }
            // 1 is Sunday.
            DAY_OF_WEEK => encode(now.weekday().number_days_from_sunday() + 1),
            DAY_OF_MONTH => encode(now.day()),
            MONTH => encode(u8::from(now.month())),
            YEAR => encode(now.year().rem_euclid(100) as u8),
            CENTURY => encode((now.year().div_euclid(100)).clamp(0, 99) as u8),
            // No interrupt flags: this clock raises no IRQ 8.
            REG_C => 0,
            REG_D => REG_D_VRT,
            i => self.ram[i as usize],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn read(c: &mut Cmos, reg: u8, now: OffsetDateTime) -> u8 {
        c.write(INDEX_PORT, reg);
        c.read_at(now)
    }

    #[test]
    fn the_clock_reads_the_time_in_bcd_24_hour_mode_as_a_pc_firmware_leaves_it() {
        let now = datetime!(2026-11-27 21:05:09 UTC);
        let mut c = Cmos::default();
        let got: Vec<u8> = [SECONDS, MINUTES, HOURS, DAY_OF_WEEK, DAY_OF_MONTH, MONTH, YEAR, CENTURY]
            .map(|r| read(&mut c, r, now))
            .into();
        // A Friday: day 6 of the week.
        assert_eq!(got, [0x09, 0x05, 0x21, 0x06, 0x27, 0x11, 0x26, 0x20]);
        assert_eq!(read(&mut c, REG_A, now) & REG_A_UIP, 0, "no update in progress");
        assert_eq!(read(&mut c, REG_D, now), REG_D_VRT, "the time is valid");
    }

    #[test]
    fn register_b_selects_binary_and_12_hour_modes() {
        let now = datetime!(2026-11-27 21:05:09 UTC);
        let mut c = Cmos::default();
        c.write(INDEX_PORT, REG_B);
        c.write(DATA_PORT, REG_B_BINARY);
        assert_eq!(read(&mut c, HOURS, now), 9 | 0x80, "9 PM in binary, 12-hour mode");
        assert_eq!(read(&mut c, YEAR, now), 26);
        c.write(INDEX_PORT, REG_B);
        c.write(DATA_PORT, 0);
        assert_eq!(read(&mut c, HOURS, datetime!(2026-11-27 00:30:00 UTC)), 0x12, "midnight is 12 AM");
    }

    #[test]
    fn the_clock_ignores_writes_and_the_rest_is_ram() {
        let now = datetime!(2026-11-27 21:05:09 UTC);
        let mut c = Cmos::default();
        c.write(INDEX_PORT, SECONDS | 0x80); // NMI disable bit set: same register
        c.write(DATA_PORT, 0x59);
        assert_eq!(c.read_at(now), 0x09);
        c.write(INDEX_PORT, 0x40);
        c.write(DATA_PORT, 0xA5);
        assert_eq!(read(&mut c, 0x40, now), 0xA5);
        c.write(INDEX_PORT, REG_A);
        c.write(DATA_PORT, 0xA6);
        assert_eq!(c.read_at(now), 0x26, "UIP cannot be set");
    }
}
