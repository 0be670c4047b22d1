//! The hardware prefetchers of the cache model (README, "The cache model"): from the accesses each
//! one watches, the lines it asks for. Pure state machines; [`super::cache`] performs the requests.
//!
//! After Intel's optimization reference manual (order number 248966: "Data Prefetch to L1 Data
//! Cache" and "Data Prefetch to the L2 and Last Level Cache" for Sandy Bridge on, "Data Prefetch
//! Logic" for Intel Core), made exact where it gives no number:
//! - the DCU prefetcher fetches the next line when a load is to the same line as the load before
//!   it, at a higher address ("an ascending access to very recently loaded data");
//! - the IP-based stride prefetcher remembers, per load instruction, its last address and stride,
//!   and once two successive strides of at most 2 KiB are equal, fetches the line at the current
//!   address plus the stride;
//! - the streamer follows one stream per 4 KiB page in a table of pages with LRU replacement:
//!   the first request to a page opens its entry, the next one to another line of it sets the
//!   direction, and from then on each request in that direction prefetches up to two lines past
//!   the furthest one fetched, at most `distance` lines ahead of the request; a request against
//!   the direction starts the detection again.
//!
//! None of them crosses a 4 KiB page.

use emon_pmu::profile::Streamer as StreamerParams;

/// Bytes in the page no prefetcher crosses.
pub const PAGE: u64 = 4096;
/// Load instructions the IP-based stride prefetcher tracks: a direct-mapped table indexed by
/// RIP\[7:0\]. Intel documents no size; this is emon's choice.
pub const IP_ENTRIES: usize = 256;
/// The largest stride the IP-based prefetcher detects, forward or backward (the manual: 2 KiB).
pub const IP_MAX_STRIDE: i64 = 2048;

/// The DCU next-line prefetcher: the last load's linear address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dcu {
    last: Option<u64>,
}

impl Dcu {
    /// A load whose first byte is at `linear`: the line after it (as a byte offset from the
    /// load's own line), when the load ascends within the line of the load before it.
    pub fn load(&mut self, linear: u64, line_shift: u32) -> Option<u64> {
        let previous = self.last.replace(linear)?;
        let ascends = previous >> line_shift == linear >> line_shift && linear > previous;
        ascends.then_some(1u64 << line_shift)
    }
}

/// One load instruction's entry in the IP-based stride prefetcher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct IpEntry {
    /// The instruction's address (0 in an entry never used).
    rip: u64,
    /// Its last data address and the stride that led there.
    last: u64,
    stride: i64,
}

/// The IP-based stride prefetcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpStride {
    table: Vec<IpEntry>,
}

impl Default for IpStride {
    fn default() -> Self {
        IpStride { table: vec![IpEntry::default(); IP_ENTRIES] }
    }
}

impl IpStride {
    /// A load at `linear` by the instruction at `rip`: the stride to prefetch at, once the
    /// instruction has repeated a stride.
    pub fn load(&mut self, rip: u64, linear: u64) -> Option<i64> {
        let e = &mut self.table[(rip % IP_ENTRIES as u64) as usize];
        if e.rip != rip {
            *e = IpEntry { rip, last: linear, stride: 0 };
            return None;
        }
        let stride = linear.wrapping_sub(e.last) as i64;
        let repeated = stride != 0 && stride.abs() <= IP_MAX_STRIDE && stride == e.stride;
        e.last = linear;
        e.stride = stride;
        repeated.then_some(stride)
    }
}

/// One page the streamer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stream {
    page: u64,
    /// The line (index within the page) of the last request.
    last: u64,
    /// +1 ascending, -1 descending, 0 not yet known.
    direction: i64,
    /// The furthest line fetched in the direction.
    head: u64,
}

/// The L2 streamer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamer {
    params: StreamerParams,
    /// Most recently used first.
    streams: Vec<Stream>,
}

impl Streamer {
    pub fn new(params: StreamerParams) -> Streamer {
        Streamer { params, streams: Vec::with_capacity(params.pages as usize) }
    }

    /// Its reach.
    pub fn params(&self) -> StreamerParams {
        self.params
    }

    /// A request from L1 for `line` (a physical line number; `per_page` lines to a 4 KiB page):
    /// the lines the streamer prefetches, at most two.
    pub fn request(&mut self, line: u64, per_page: u64) -> [Option<u64>; 2] {
        let (page, i) = (line / per_page, line % per_page);
        let Some(k) = self.streams.iter().position(|s| s.page == page) else {
            if self.streams.len() >= self.params.pages as usize {
                self.streams.pop();
            }
            self.streams.insert(0, Stream { page, last: i, direction: 0, head: i });
            return [None; 2];
        };
        self.streams[..=k].rotate_right(1);
        let s = &mut self.streams[0];
        if i == s.last {
            return [None; 2];
        }
        let direction = if i > s.last { 1 } else { -1 };
        s.last = i;
        if s.direction == 0 {
            (s.direction, s.head) = (direction, i);
        } else if s.direction != direction {
            s.direction = 0;
            return [None; 2];
        }
        // Past the furthest line fetched (or the request, if it overtook it).
        let mut head = if direction > 0 { s.head.max(i) } else { s.head.min(i) };
        let mut out = [None; 2];
        for slot in &mut out {
            let Some(next) = head.checked_add_signed(direction).filter(|&n| n < per_page) else { break };
            if next.abs_diff(i) > u64::from(self.params.distance) {
                break;
            }
            *slot = Some(page * per_page + next);
            head = next;
        }
        s.head = head;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dcu_prefetcher_fetches_the_next_line_on_an_ascending_access_within_a_line() {
        let mut d = Dcu::default();
        assert_eq!(d.load(0x1000, 6), None, "nothing loaded before");
        assert_eq!(d.load(0x1008, 6), Some(64), "ascending within the line");
        assert_eq!(d.load(0x1004, 6), None, "descending");
        assert_eq!(d.load(0x1040, 6), None, "a new line");
        assert_eq!(d.load(0x1041, 6), Some(64));
    }

    #[test]
    fn the_ip_prefetcher_fetches_once_a_stride_repeats() {
        let mut ip = IpStride::default();
        assert_eq!(ip.load(0x400, 0x1000), None, "a new instruction");
        assert_eq!(ip.load(0x400, 0x1100), None, "one stride");
        assert_eq!(ip.load(0x400, 0x1200), Some(0x100), "the same stride again");
        assert_eq!(ip.load(0x400, 0x1300), Some(0x100));
        assert_eq!(ip.load(0x400, 0x1280), None, "a new stride");
        assert_eq!(ip.load(0x400, 0x1200), Some(-0x80), "backward");
        // Another instruction with the same RIP[7:0] takes the entry; strides past 2 KiB are not followed.
        assert_eq!(ip.load(0x500, 0x1000), None);
        assert_eq!(ip.load(0x400, 0x1000), None, "evicted");
        for a in [0x1000u64, 0x1000 + 4096, 0x1000 + 8192] {
            assert_eq!(ip.load(0x600, a), None, "a 4 KiB stride");
        }
        // The same address over and over is no stride.
        assert_eq!((0..3).map(|_| ip.load(0x700, 0x2000)).collect::<Vec<_>>(), [None; 3]);
    }

    #[test]
    fn the_streamer_runs_two_lines_a_request_up_to_its_distance_within_the_page() {
        let mut s = Streamer::new(StreamerParams { distance: 4, pages: 2 });
        assert_eq!(s.request(64, 64), [None, None], "page 1 opens");
        assert_eq!(s.request(65, 64), [Some(66), Some(67)], "ascending: two lines");
        assert_eq!(s.request(66, 64), [Some(68), Some(69)], "up to 3 lines ahead of 66");
        assert_eq!(s.request(67, 64), [Some(70), Some(71)], "4 ahead of 67 at most");
        assert_eq!(s.request(68, 64), [Some(72), None], "the distance holds it back");
        // The end of the page stops it.
        let mut s = Streamer::new(StreamerParams { distance: 20, pages: 2 });
        s.request(61, 64);
        assert_eq!(s.request(62, 64), [Some(63), None]);
        assert_eq!(s.request(63, 64), [None, None]);
        // Descending.
        s.request(128 + 10, 64);
        assert_eq!(s.request(128 + 9, 64), [Some(128 + 8), Some(128 + 7)]);
        // Against the direction: detection starts again.
        assert_eq!(s.request(128 + 12, 64), [None, None]);
        assert_eq!(s.request(128 + 13, 64), [Some(128 + 14), Some(128 + 15)]);
        // Two pages tracked: a third replaces the least recently used (page 0, at line 63).
        s.request(256, 64);
        assert_eq!(s.request(62, 64), [None, None], "page 0 starts over");
    }
}
