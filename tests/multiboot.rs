//! The multiboot v1 boot path, proved with a kernel built from a few lines of assembly: entry
//! state (EAX magic, EBX info), the information structure (memory, command line as QEMU builds
//! it, memory map, boot loader name, modules) and fw_cfg.
mod common;
use common::*;

const PROBE: &str = r#"
    mov %eax, %ebp
    mov %ebx, %esi
    lea m_magic, %edi
    call puts
    mov %ebp, %eax
    call print_hex
    lea m_flags, %edi
    call puts
    mov 0(%esi), %eax
    call print_hex
    lea m_lower, %edi
    call puts
    mov 4(%esi), %eax
    call print_hex
    lea m_upper, %edi
    call puts
    mov 8(%esi), %eax
    call print_hex
    lea m_mmap, %edi
    call puts
    mov 44(%esi), %eax
    call print_hex
    lea m_mods, %edi
    call puts
    mov 20(%esi), %eax
    call print_hex
    test %eax, %eax
    jz 6f
    mov 24(%esi), %ebx
    lea m_mod0, %edi
    call puts
    mov 4(%ebx), %eax
    sub 0(%ebx), %eax
    call print_hex
    mov 0(%ebx), %edi
    call puts
6:  lea m_loader, %edi
    call puts
    mov 64(%esi), %edi
    call puts
    lea m_cmdline, %edi
    call puts
    mov 16(%esi), %edi
    call puts
    lea m_end, %edi
    call puts
    /* fw_cfg: select the signature (key 0), read 4 bytes */
    lea m_fwcfg, %edi
    call puts
    mov $0x510, %dx
    xor %eax, %eax
    out %ax, %dx
    mov $4, %ecx
7:  mov $0x511, %dx
    in %dx, %al
    mov $0x3f8, %dx
    out %al, %dx
    dec %ecx
    jnz 7b
    lea m_end, %edi
    call puts
    xor %eax, %eax
    cmp $0x2BADB002, %ebp
    je exit
    mov $1, %eax
    jmp exit
m_magic:   .asciz "magic="
m_flags:   .asciz "flags="
m_lower:   .asciz "mem_lower="
m_upper:   .asciz "mem_upper="
m_mmap:    .asciz "mmap_length="
m_mods:    .asciz "mods_count="
m_mod0:    .asciz "mod0_size="
m_loader:  .asciz "loader="
m_cmdline: .asciz "\ncmdline=<"
m_fwcfg:   .asciz "fw_cfg="
m_end:     .asciz ">\n"
"#;

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in\n{out}"))
}

#[test]
fn multiboot_kernel_gets_magic_info_and_qemu_style_cmdline() {
    if !kvm_available() {
        return;
    }
    let kernel = assemble("mb-probe", &multiboot_source(PROBE), false, 0x100000);
    let module = tmp_dir("kernels").join("module.txt");
    std::fs::write(&module, b"hello module\n\0").unwrap();
    let k = kernel.to_str().unwrap();
    let r = emon(&["run", "--memory", "32", "--module", module.to_str().unwrap(), k, "--", "console=ttyS0", "x=1"]);
    r.assert_status(0);
    let out = &r.stdout;
    assert_eq!(field(out, "magic="), "2badb002");
    let flags = u32::from_str_radix(field(out, "flags="), 16).unwrap();
    for bit in [0, 2, 3, 6, 9] {
        assert!(flags & (1 << bit) != 0, "multiboot_info.flags {flags:#x} lacks bit {bit}");
    }
    assert_eq!(field(out, "mem_lower="), format!("{:08x}", 639));
    assert_eq!(field(out, "mem_upper="), format!("{:08x}", 31 * 1024));
    assert_eq!(field(out, "mmap_length="), format!("{:08x}", 4 * 24));
    assert_eq!(field(out, "mods_count="), "00000001");
    assert_eq!(field(out, "mod0_size="), format!("{:08x}", 14));
    assert!(out.contains("hello module"), "{out}");
    assert_eq!(field(out, "loader="), "emon");
    // QEMU builds "<kernel path> <arguments>".
    assert_eq!(field(out, "cmdline=<"), format!("{k} console=ttyS0 x=1>"));
    assert_eq!(field(out, "fw_cfg="), "QEMU>");
}

#[test]
fn multiboot_cmdline_without_arguments_is_the_path_and_a_space() {
    if !kvm_available() {
        return;
    }
    let kernel = assemble("mb-probe2", &multiboot_source(PROBE), false, 0x100000);
    let k = kernel.to_str().unwrap();
    let r = emon(&["run", k]);
    r.assert_status(0);
    assert_eq!(field(&r.stdout, "cmdline=<"), format!("{k} >"));
    assert_eq!(field(&r.stdout, "mods_count="), "00000000");
}
