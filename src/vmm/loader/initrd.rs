//! The initial ramdisk of a Linux kernel (`--initrd`): placed as high in RAM as the kernel
//! accepts (below its `initrd_addr_max`), page-aligned, above everything the kernel occupies.
use super::{write_mem, KernelError, Module};
use vm_memory::GuestMemoryMmap;

const PAGE: u64 = 0x1000;

/// The guest-physical address for an initrd of `size` bytes: as high as possible below both the
/// end of RAM and `addr_max` (the highest address its last byte may have), page-aligned, at or
/// above `lowest`.
pub fn place(size: u64, ram_size: u64, addr_max: u64, lowest: u64) -> Result<u64, KernelError> {
    let top = ram_size.min(addr_max.saturating_add(1));
    let too_big = || KernelError::InitrdDoesNotFit { size, lowest, top, ram_mib: ram_size >> 20 };
    let start = top.checked_sub(size).ok_or_else(too_big)? & !(PAGE - 1);
    if start < lowest {
        return Err(too_big());
    }
    Ok(start)
}

/// Places and writes `initrd`; returns its address and size.
pub fn load(
    mem: &GuestMemoryMmap,
    initrd: &Module,
    ram_size: u64,
    addr_max: u64,
    lowest: u64,
) -> Result<(u64, u64), KernelError> {
    let size = initrd.data.len() as u64;
    let addr = place(size, ram_size, addr_max, lowest)?;
    write_mem(mem, addr, &initrd.data)?;
    Ok((addr, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goes_high_page_aligned_below_ram_end_and_addr_max() {
        assert_eq!(place(0x1800, 64 << 20, u64::MAX, 0).unwrap(), (64 << 20) - 0x2000);
        assert_eq!(place(0x1000, 0xC000_0000, 0x7FFF_FFFF, 0).unwrap(), 0x7FFF_F000);
    }

    #[test]
    fn an_initrd_that_would_overlap_the_kernel_is_refused() {
        let e = place(60 << 20, 64 << 20, u64::MAX, 8 << 20).unwrap_err().to_string();
        assert!(e.contains("--memory"), "{e}");
        assert!(place(128 << 20, 64 << 20, u64::MAX, 0).is_err());
    }
}
