//! Host perf events (perf_event_open). Today: probing whether the host can count the guest's
//! events in hardware, which `--backend auto` uses to choose.
use perf_event_open_sys::bindings::{
    perf_event_attr, PERF_COUNT_HW_INSTRUCTIONS, PERF_FLAG_FD_CLOEXEC, PERF_TYPE_HARDWARE,
};
use std::io;

/// Whether the host can count the guest's instructions in hardware: opens, then closes, a
/// PERF_TYPE_HARDWARE/PERF_COUNT_HW_INSTRUCTIONS event with exclude_host on this thread.
pub fn probe_hardware() -> io::Result<()> {
    let mut attr = perf_event_attr {
        type_: PERF_TYPE_HARDWARE,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        config: PERF_COUNT_HW_INSTRUCTIONS as u64,
        ..Default::default()
    };
    attr.set_disabled(1);
    attr.set_exclude_host(1);
    // SAFETY: `attr` is a valid, fully initialized perf_event_attr; pid 0 / cpu -1 is this thread.
    let fd = unsafe { perf_event_open_sys::perf_event_open(&mut attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC as _) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by perf_event_open and is owned here.
    unsafe { libc::close(fd) };
    Ok(())
}
