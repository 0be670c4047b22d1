//! PmuProfile / Profile register encoding and enumeration helpers.

use super::super::{PmuProfile, ARCH_EVENTS};
use super::sample;

fn v5(fixed: u8, bitmap: u32) -> PmuProfile {
    PmuProfile {
        version: 5,
        gp: 8,
        gp_width: 48,
        ebx_length: 8,
        ebx_unavailable: 0,
        fixed,
        fixed_width: 48,
        fixed_bitmap: bitmap,
        perf_capabilities: 0,
        misc_enable_perfmon: true,
        nominal_mhz: 2000,
        ..PmuProfile::default()
    }
}

#[test]
fn v5_bitmap_with_no_contiguous_counters() {
    let p = v5(0, 0b1001);
    let supported: Vec<u8> = (0..8).filter(|&i| p.fixed_supported(i)).collect();
    assert_eq!(supported, [0, 3]);
    assert_eq!(p.fixed_msr_count(), 4);
}

#[test]
fn v5_bitmap_and_contiguous_count_are_ored() {
    let p = v5(2, 0b1000);
    let supported: Vec<u8> = (0..8).filter(|&i| p.fixed_supported(i)).collect();
    assert_eq!(supported, [0, 1, 3]);
    assert_eq!(p.fixed_msr_count(), 4);

    let p = v5(1, 0b0100);
    assert_eq!(p.fixed_msr_count(), 3);
    assert!(!p.fixed_supported(1));
}

#[test]
fn v5_without_fixed_counters() {
    let p = v5(0, 0);
    assert_eq!(p.fixed_msr_count(), 0);
    assert!(!p.fixed_supported(0));
}

#[test]
fn bitmap_is_ignored_before_v5_and_fixed_before_v2() {
    let mut p = v5(2, 0b1000);
    p.version = 4;
    assert!(!p.fixed_supported(3));
    assert_eq!(p.fixed_msr_count(), 2);
    p.version = 1;
    assert_eq!(p.fixed_msr_count(), 0);
    // Large indices never panic.
    assert!(!p.fixed_supported(255));
}

#[test]
fn arch_event_available_needs_bit_below_length_and_clear() {
    let mut p = v5(4, 0);
    p.ebx_length = 7;
    p.ebx_unavailable = 0x18;
    let available: Vec<u8> = (0..10).filter(|&b| p.arch_event_available(b)).collect();
    assert_eq!(available, [0, 1, 2, 5, 6]);
    assert!(!p.arch_event_available(255));
}

#[test]
fn leaf_0a_packs_the_fields() {
    let mut p = v5(3, 0b1000);
    p.ebx_unavailable = 0x41;
    p.gp = 6;
    p.gp_width = 40;
    p.fixed_width = 36;
    assert_eq!(
        p.leaf_0a(),
        [0x0828_0605, 0x41, 0b1000, 3 | 36 << 5],
        "EAX=len|width|gp|version, EBX, ECX, EDX=width<<5|count"
    );
}

#[test]
fn fw_write_reads_bit_13() {
    let mut p = v5(0, 0);
    assert!(!p.fw_write());
    p.perf_capabilities = 0x33C5;
    assert!(p.fw_write());
    assert!(p.pdcm());
}

#[test]
fn arch_events_match_table_18_1() {
    for (i, ev) in ARCH_EVENTS.iter().enumerate() {
        assert_eq!(usize::from(ev.bit), i);
    }
    assert_eq!((ARCH_EVENTS[1].event_select, ARCH_EVENTS[1].fixed), (0xC0, Some(0)));
    assert_eq!((ARCH_EVENTS[4].event_select, ARCH_EVENTS[4].umask), (0x2E, 0x41));
    assert_eq!((ARCH_EVENTS[7].event_select, ARCH_EVENTS[7].fixed), (0xA4, Some(3)));
}

#[test]
fn leaf1_eax_uses_extended_family_and_model() {
    let mut p = sample();
    assert_eq!(p.leaf1_eax(), 0x0005_06E3);
    p.family = 0xF;
    p.model = 0x6;
    p.stepping = 5;
    assert_eq!(p.leaf1_eax(), 0x0000_0F65, "family 0xF has extended family 0");
    p.family = 0x19;
    p.model = 0x21;
    p.stepping = 0;
    assert_eq!(p.leaf1_eax(), 0x00A2_0F10, "AMD Zen 3 style signature");
    p.family = 0x10E;
    assert_eq!(p.leaf1_eax() >> 20, 0xFF);
}

#[test]
fn vendor_regs_are_ebx_edx_ecx() {
    let mut p = sample();
    p.vendor = "AuthenticAMD".to_string();
    assert_eq!(p.vendor_regs(), [0x6874_7541, 0x6974_6E65, 0x444D_4163]);
    p.vendor = "short".to_string();
    assert_eq!(p.vendor_regs()[0], u32::from_le_bytes(*b"shor"));
    assert_eq!(p.vendor_regs()[2], 0);
}
