//! The Linux boot protocols, proved with small kernels that print what they were entered with: a
//! PVH ELF (the "Xen" note of type 18) and a synthetic 64-bit bzImage; the refusal of a vmlinux
//! without a PVH note; `--initrd`; and Debian's distribution kernel.
mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in\n{out}"))
}

fn initrd_file(name: &str, text: &[u8]) -> PathBuf {
    let path = tmp_dir("kernels").join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Prints the start info's fields, the initrd module and the memory map's last entry.
const PVH_PROBE: &str = r#"
    .section .note.Xen, "a", @note
    .align 4
    .long 4
    .long 4
    .long 18                    /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .align 4
    .long _start
    .code32
    .section .text
    .globl _start
_start:
    mov %ebx, %esi
    lea m_ebx, %edi
    call puts
    mov %esi, %eax
    call print_hex
    lea m_magic, %edi
    call puts
    mov 0(%esi), %eax
    call print_hex
    lea m_version, %edi
    call puts
    mov 4(%esi), %eax
    call print_hex
    lea m_mods, %edi
    call puts
    mov 12(%esi), %eax
    call print_hex
    mov 16(%esi), %ebx          /* modlist_paddr */
    lea m_mod0, %edi
    call puts
    mov 8(%ebx), %eax
    call print_hex
    mov 0(%ebx), %edi
    call puts
    lea m_entries, %edi
    call puts
    mov 48(%esi), %eax
    call print_hex
    mov 40(%esi), %ebx          /* memmap_paddr; entry 3 is 72 bytes in */
    lea m_ram_end, %edi
    call puts
    mov 72(%ebx), %eax
    add 80(%ebx), %eax
    call print_hex
    lea m_cr0, %edi
    call puts
    mov %cr0, %eax
    call print_hex
    lea m_cmdline, %edi
    call puts
    mov 24(%esi), %edi
    call puts
    lea m_end, %edi
    call puts
    xor %eax, %eax
    jmp exit
m_ebx:     .asciz "ebx="
m_magic:   .asciz "magic="
m_version: .asciz "version="
m_mods:    .asciz "nr_modules="
m_mod0:    .asciz "mod0_size="
m_entries: .asciz "memmap_entries="
m_ram_end: .asciz "ram_end="
m_cr0:     .asciz "cr0="
m_cmdline: .asciz "cmdline=<"
m_end:     .asciz ">\n"
"#;

#[test]
fn a_pvh_kernel_gets_ebx_at_the_start_info_with_cmdline_memmap_and_initrd() {
    if !kvm_available() {
        return;
    }
    let kernel = assemble("pvh-probe", &format!("{PVH_PROBE}{HELPERS32}"), true, 0x100000);
    let initrd = initrd_file("pvh-initrd", b"hello initrd\n\0");
    let k = kernel.to_str().unwrap();
    let r = emon(&["run", "--memory", "32", "--initrd", initrd.to_str().unwrap(), k, "--", "console=ttyS0", "x=1"]);
    r.assert_status(0);
    let out = &r.stdout;
    assert_eq!(field(out, "ebx="), "0000b000");
    assert_eq!(field(out, "magic="), "336ec578");
    assert_eq!(field(out, "version="), "00000001");
    assert_eq!(field(out, "nr_modules="), "00000001");
    assert_eq!(field(out, "mod0_size="), "0000000e");
    assert!(out.contains("hello initrd"), "{out}");
    assert_eq!(field(out, "memmap_entries="), "00000004");
    assert_eq!(field(out, "ram_end="), "02000000");
    let cr0 = u32::from_str_radix(field(out, "cr0="), 16).unwrap();
    assert_eq!(cr0 & 0x8000_0001, 1, "CR0.PE set, paging off: {cr0:#x}");
    // Linux kernels get the arguments as they are, without the kernel's path.
    assert_eq!(field(out, "cmdline=<"), "console=ttyS0 x=1>");
}

/// 64-bit code at startup_64 (0x200 into the protected-mode kernel): prints RSI, fields of the
/// zero page, CS and DS.
const BZIMAGE_PROBE: &str = r#"
    .code64
    .section .text
    .globl _start
_start:
    .org 0x200
startup_64:
    mov %rsi, %rbp
    lea m_rsi(%rip), %rdi
    call puts
    mov %ebp, %eax
    call print_hex
    lea m_hdrs(%rip), %rdi
    call puts
    mov 0x202(%rbp), %eax
    call print_hex
    lea m_loader(%rip), %rdi
    call puts
    movzbl 0x210(%rbp), %eax
    call print_hex
    lea m_e820(%rip), %rdi
    call puts
    movzbl 0x1e8(%rbp), %eax
    call print_hex
    lea m_ramdisk(%rip), %rdi
    call puts
    mov 0x21c(%rbp), %eax
    call print_hex
    mov 0x218(%rbp), %edi
    call puts
    lea m_cs(%rip), %rdi
    call puts
    xor %eax, %eax
    mov %cs, %ax
    call print_hex
    lea m_ds(%rip), %rdi
    call puts
    xor %eax, %eax
    mov %ds, %ax
    call print_hex
    lea m_cmdline(%rip), %rdi
    call puts
    mov 0x228(%rbp), %edi
    call puts
    lea m_end(%rip), %rdi
    call puts
    xor %eax, %eax
exit:
    mov $0xf4, %dx
    out %eax, %dx
1:  hlt
    jmp 1b
puts:
    push %rax
    push %rdx
    mov $0x3f8, %dx
2:  movb (%rdi), %al
    test %al, %al
    jz 3f
    out %al, %dx
    inc %rdi
    jmp 2b
3:  pop %rdx
    pop %rax
    ret
print_hex:
    push %rcx
    push %rdx
    push %rax
    mov $8, %ecx
4:  rol $4, %eax
    push %rax
    and $0xf, %eax
    cmp $10, %eax
    jb 5f
    add $('a' - '0' - 10), %eax
5:  add $'0', %eax
    mov $0x3f8, %dx
    out %al, %dx
    pop %rax
    dec %ecx
    jnz 4b
    mov $'\n', %al
    out %al, %dx
    pop %rax
    pop %rdx
    pop %rcx
    ret
m_rsi:     .asciz "rsi="
m_hdrs:    .asciz "header="
m_loader:  .asciz "type_of_loader="
m_e820:    .asciz "e820_entries="
m_ramdisk: .asciz "ramdisk_size="
m_cs:      .asciz "cs="
m_ds:      .asciz "ds="
m_cmdline: .asciz "cmdline=<"
m_end:     .asciz ">\n"
"#;

/// A bzImage around `code` (the protected-mode kernel, loaded at 1 MiB): four setup sectors and
/// a boot-protocol 2.15 header declaring a relocatable kernel with the 64-bit entry point.
fn bzimage(code: &[u8]) -> Vec<u8> {
    let mut img = vec![0u8; 5 * 512];
    let mut put = |off: usize, bytes: &[u8]| img[off..off + bytes.len()].copy_from_slice(bytes);
    put(0x1F1, &[4]); // setup_sects
    put(0x1FE, &0xAA55u16.to_le_bytes()); // boot_flag
    put(0x202, b"HdrS");
    put(0x206, &0x020Fu16.to_le_bytes()); // version
    put(0x211, &[1]); // loadflags: LOADED_HIGH
    put(0x214, &0x10_0000u32.to_le_bytes()); // code32_start
    put(0x22C, &0x7FFF_FFFFu32.to_le_bytes()); // initrd_addr_max
    put(0x230, &0x20_0000u32.to_le_bytes()); // kernel_alignment
    put(0x234, &[1]); // relocatable_kernel
    put(0x236, &1u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    put(0x238, &2047u32.to_le_bytes()); // cmdline_size
    put(0x258, &0x100_0000u64.to_le_bytes()); // pref_address
    put(0x260, &0x10_0000u32.to_le_bytes()); // init_size
    img.extend(code);
    img
}

#[test]
fn a_bzimage_is_entered_at_startup_64_with_rsi_at_the_zero_page() {
    if !kvm_available() {
        return;
    }
    let elf = assemble("bz-probe", BZIMAGE_PROBE, true, 0x100000);
    let bin = elf.with_extension("bin");
    let st = Command::new("objcopy").args(["-O", "binary", "-j", ".text"]).arg(&elf).arg(&bin).status().unwrap();
    assert!(st.success(), "objcopy failed on {}", elf.display());
    let kernel = tmp_dir("kernels").join("bz-probe.bzImage");
    std::fs::write(&kernel, bzimage(&std::fs::read(&bin).unwrap())).unwrap();
    let initrd = initrd_file("bz-initrd", b"hello bzImage initrd\n\0");
    let r = emon(&[
        "run",
        "--memory",
        "32",
        "--initrd",
        initrd.to_str().unwrap(),
        kernel.to_str().unwrap(),
        "--",
        "console=ttyS0",
        "earlyprintk=serial",
    ]);
    r.assert_status(0);
    let out = &r.stdout;
    assert_eq!(field(out, "rsi="), "0000a000");
    assert_eq!(field(out, "header="), "53726448");
    assert_eq!(field(out, "type_of_loader="), "000000ff");
    assert_eq!(field(out, "e820_entries="), "00000004");
    assert_eq!(field(out, "ramdisk_size="), "00000016");
    assert!(out.contains("hello bzImage initrd"), "{out}");
    // __BOOT_CS and __BOOT_DS (Documentation/x86/boot.rst, 64-bit boot protocol).
    assert_eq!(field(out, "cs="), "00000010");
    assert_eq!(field(out, "ds="), "00000018");
    assert_eq!(field(out, "cmdline=<"), "console=ttyS0 earlyprintk=serial>");
}

#[test]
fn a_vmlinux_without_a_pvh_note_is_refused_in_one_line() {
    // Needs no KVM: the kernel is refused before a VM is built... but after /dev/kvm is opened,
    // so it runs only where the other boot tests do.
    if !kvm_available() {
        return;
    }
    let source = r#"
    .section .note.Linux, "a", @note
    .align 4
    .long 6
    .long 4
    .long 0x100
    .asciz "Linux"
    .align 4
    .long 0
    .code64
    .section .text
    .globl _start
_start:
    hlt
"#;
    let kernel = assemble("vmlinux-no-pvh", source, true, 0x100000);
    let r = emon(&["run", "--timeout", "5", kernel.to_str().unwrap(), "--", "console=ttyS0"]);
    r.assert_status(2);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("Linux vmlinux without a PVH entry point"), "{}", r.stderr);
    assert!(r.stderr.contains("bzImage") && r.stderr.contains("CONFIG_PVH=y"), "{}", r.stderr);
}

#[test]
fn a_missing_initrd_is_a_one_line_error() {
    let r = emon(&["run", "--initrd", "/nonexistent/initrd.img", "guest:cpuid-report"]);
    r.assert_status(2);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.starts_with("emon: --initrd /nonexistent/initrd.img: "), "{}", r.stderr);
}

#[test]
fn an_initrd_for_a_kernel_that_is_not_linux_is_refused() {
    if !kvm_available() {
        return;
    }
    let initrd = initrd_file("stray-initrd", b"x");
    let r = emon(&["run", "--initrd", initrd.to_str().unwrap(), "guest:cpuid-report"]);
    r.assert_status(2);
    assert!(r.stderr.contains("--initrd is for Linux kernels"), "{}", r.stderr);
}

/// Debian's distribution kernel, fetched once per machine by scripts/debian-kernel from Debian's
/// package registry (which CI reaches): the bzImage, or with `args` ["--vmlinux"] the vmlinux
/// inside it. A kernel that cannot be fetched fails the test: it is part of the set-up.
fn debian_kernel_with(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/debian-kernel");
    let out = Command::new(script).args(args).output().expect("run scripts/debian-kernel");
    assert!(
        out.status.success(),
        "scripts/debian-kernel {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn debian_kernel() -> String {
    debian_kernel_with(&[])
}

/// Debian's vmlinux has the PVH note: booted through PVH (no decompression) it prints its banner,
/// the command line and emon's memory map within seconds, and boots on to its root mount (about
/// 38 s here; README, "Distribution kernels"). The timeout ends the run long after the lines
/// checked here.
#[test]
fn debians_vmlinux_boots_through_pvh_to_its_banner_and_memory_map() {
    if !kvm_available() {
        return;
    }
    let kernel = debian_kernel_with(&["--vmlinux"]);
    let r = emon(&["run", "--memory", "128", "--timeout", "60", &kernel, "--", "console=ttyS0", "earlyprintk=serial"]);
    let out = &r.stdout;
    let context = format!("status {}\n{out}\n{}", r.status, r.stderr);
    assert!(out.contains("] Linux version 6."), "{context}");
    assert!(out.contains("Command line: console=ttyS0 earlyprintk=serial"), "{context}");
    assert!(out.contains("BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable"), "{context}");
    assert!(out.contains("BIOS-e820: [mem 0x0000000000100000-0x0000000007ffffff] usable"), "{context}");
}

#[test]
fn debians_kernel_is_recognized_and_needs_room_to_decompress() {
    if !kvm_available() {
        return;
    }
    let kernel = debian_kernel();
    // 64 MiB cannot hold the kernel decompressed at 16 MiB: refused at once, saying so.
    let r = emon(&["run", "--memory", "64", "--timeout", "5", &kernel, "--", "console=ttyS0"]);
    r.assert_status(2);
    assert!(r.stderr.contains("the decompressed kernel") && r.stderr.contains("--memory"), "{}", r.stderr);
}
