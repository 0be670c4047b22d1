// SPDX-License-Identifier: Apache-2.0 OR MIT
/*
 * emon-perf-user: perf_event_open(2) from user space, used as perf uses it, on loops whose counts
 * are known exactly. scripts/linux-initramfs builds it static into the initramfs (/bin). It prints
 * kvm-unit-tests-style lines, "PASS: name", "FAIL: name", "KFAIL: name", "SKIP: name (reason)",
 * and "SUMMARY: T tests, F unexpected failures[, K known failures], S skipped" (emon test parses
 * them; README, "emon test"), and exits 0 when nothing failed unexpectedly, else 1.
 *
 * The known loop, `1: dec %r8; jnz 1b` run n times (n >= 1), retires 2n instructions and n
 * branches (n conditional jumps, n - 1 of them taken), all in user mode. Its counts are checked
 * exactly where they are defined:
 *
 *   - Every counted run goes through emon_enable_loop_disable below, which enables the event (or
 *     group) with a raw SYSCALL of ioctl(PERF_EVENT_IOC_ENABLE), runs the loop and disables it with
 *     a second raw SYSCALL. Between the two, user mode executes the same instructions whatever n
 *     is, besides the loop: one MOV before it, two MOVs and the disabling SYSCALL after it. So the
 *     difference of two runs of n1 and n2 iterations is exactly 2(n2 - n1) instructions and
 *     n2 - n1 branches at :u, whether or not a CPU counts the SYSCALL as a user-mode instruction
 *     or branch. The intercept (count - 2n) is printed for information: 4 instructions and 1
 *     branch when the disabling SYSCALL counts in user mode (emon's attribution: an instruction
 *     counts at the privilege level it begins at; SYSCALL is a branch).
 *   - In one group {E, E:u, E:k}, enabled and disabled through the leader (the siblings are
 *     created enabled, so the group goes on and off the PMU at once: IA32_PERF_GLOBAL_CTRL on
 *     architectural PMUs v2+), the three count the same instructions: E = E:u + E:k exactly.
 *   - Sampling every P user-mode instructions: the loop is sized 2n = 100.5 P, so every overflow
 *     is inside it (the interrupted IP is a loop instruction, or emon_loop_end after the last
 *     one, which no overflow reaches), and the number of samples (or overflow signals) is
 *     exactly floor(total / P), where total is the event's final count. total must also equal
 *     the counting event's 2n + intercept: sampling does not change the count.
 *   - rdpmc through the mmap page (perf's self-monitoring protocol: lock, index, offset,
 *     pmc_width): the difference of two reads around emon_known_loop(n1) and (n2) is exactly
 *     2(n2 - n1), the code between the reads being the same but the loop.
 *   - Cycles are not defined per instruction: the checks are that the loop costs at least one
 *     cycle per iteration at :u, and the group split E = E:u + E:k.
 *   - :k counts run kernel code that is not the same from run to run (interrupts): they must be
 *     non-zero, and add up in the group.
 *
 * Software events (task-clock, page-faults) are checked too, so that a kernel without a hardware
 * PMU (emon's no-pmu profile, QEMU's TCG) still runs the ring-buffer, signal and mmap-page code:
 * page-faults exactly (one per fresh anonymous page written), task-clock loosely.
 *
 * Hardware events are expected when CPUID shows a PMU Linux drives (architectural perfmon with
 * counters, or a NetBurst processor); otherwise their tests are skipped with the reason, and if
 * CPUID shows a PMU but perf_event_open fails, they fail.
 *
 * Linux throttles an event whose PMIs seem to take too long (perf_cpu_time_max_percent), and kernel
 * code is slow on hosts that emulate it, which would make samples != total / P for a reason that
 * is neither the PMU's nor perf's counting: the initramfs's /init sets that sysctl to 0 (off), and
 * this program prints it. A throttled event leaves PERF_RECORD_THROTTLE records, which the
 * sampling test counts and reports.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* --- reporting ------------------------------------------------------------------------------ */

static int tests, failures, known_failures, skipped;

/* Prints "PASS: name" or "FAIL: name"; returns ok. */
static bool report(bool ok, const char *fmt, ...)
{
	va_list ap;

	tests++;
	if (!ok)
		failures++;
	printf("%s: ", ok ? "PASS" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	return ok;
}

/* As report, but a failure is known (KFAIL): `why` says whose it is. */
static void report_kfail(bool known, bool ok, const char *why, const char *fmt, ...)
{
	va_list ap;

	tests++;
	if (!ok && known)
		known_failures++;
	else if (!ok)
		failures++;
	printf("%s: ", ok ? "PASS" : known ? "KFAIL" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	if (!ok && known)
		printf(" (%s)", why);
	printf("\n");
}

static void skip(const char *name, const char *reason)
{
	skipped++;
	printf("SKIP: %s (%s)\n", name, reason);
}

/* An explanation line before a report (emon test shows them with a failure). */
static void note(const char *fmt, ...)
{
	va_list ap;

	printf("  ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

/* --- the known loops ------------------------------------------------------------------------ */

/*
 * long emon_enable_loop_disable(int fd, unsigned long n): ioctl(fd, PERF_EVENT_IOC_ENABLE, 0),
 * n iterations of dec/jnz, ioctl(fd, PERF_EVENT_IOC_DISABLE, 0); returns the two ioctls' results
 * ORed (0 when both succeeded). Raw SYSCALLs, so that no C library code runs between them.
 * Linux's SYSCALL clobbers only RAX, RCX and R11.
 */
long emon_enable_loop_disable(long fd, unsigned long n);
extern const char emon_loop_begin[], emon_loop_end[];
asm(".text\n"
    ".globl emon_enable_loop_disable\n"
    ".type emon_enable_loop_disable, @function\n"
    "emon_enable_loop_disable:\n"
    "	mov %rsi, %r8\n"
    "	mov $0x2400, %esi\n" /* PERF_EVENT_IOC_ENABLE */
    "	xor %edx, %edx\n"
    "	mov $16, %eax\n" /* SYS_ioctl */
    "	syscall\n"
    "	mov %rax, %r9\n" /* counted from here on */
    ".globl emon_loop_begin\n"
    "emon_loop_begin:\n"
    "1:	dec %r8\n"
    "	jnz 1b\n"
    ".globl emon_loop_end\n"
    "emon_loop_end:\n"
    "	mov $0x2401, %esi\n" /* PERF_EVENT_IOC_DISABLE */
    "	mov $16, %eax\n"
    "	syscall\n" /* counted up to here */
    "	or %r9, %rax\n"
    "	ret\n"
    ".size emon_enable_loop_disable, .-emon_enable_loop_disable\n");

/* void emon_known_loop(unsigned long n): n iterations of dec/jnz (n >= 1). */
void emon_known_loop(unsigned long n);
extern const char emon_known_loop_end[];
asm(".text\n"
    ".globl emon_known_loop\n"
    ".type emon_known_loop, @function\n"
    "emon_known_loop:\n"
    "1:	dec %rdi\n"
    "	jnz 1b\n"
    ".globl emon_known_loop_end\n"
    "emon_known_loop_end:\n"
    "	ret\n"
    ".size emon_known_loop, .-emon_known_loop\n");

/* Iterations of the two counted runs: their difference is what is checked exactly. */
#define N1 1000UL
#define N2 101000UL
#define DN (N2 - N1)

/* Sampling: a period of P user-mode instructions and a loop of 2n = 100.5 P instructions. */
#define PERIOD 10000ULL
#define SAMPLED_N (PERIOD * 201 / 4)

/* --- perf ----------------------------------------------------------------------------------- */

static int perf_event_open(struct perf_event_attr *attr, pid_t pid, int cpu, int group, unsigned long flags)
{
	return (int)syscall(SYS_perf_event_open, attr, pid, cpu, group, flags);
}

enum mode { BOTH, USER, KERNEL };
static const char *const suffix[] = { "", ":u", ":k" };

struct event {
	const char *name;
	uint32_t type;
	uint64_t config;
};

static const struct event instructions = { "instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS };
static const struct event branches = { "branches", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_INSTRUCTIONS };
static const struct event cycles = { "cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES };
static const struct event task_clock = { "task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK };
static const struct event page_faults = { "page-faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS };

/* The attributes perf gives E, E:u and E:k (tools/perf: `u` sets exclude_kernel and exclude_hv,
 * `k` exclude_user and exclude_hv). */
static struct perf_event_attr attr_for(const struct event *e, enum mode m)
{
	struct perf_event_attr a;

	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.type = e->type;
	a.config = e->config;
	a.exclude_kernel = m == USER;
	a.exclude_user = m == KERNEL;
	a.exclude_hv = m != BOTH;
	a.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID;
	a.disabled = 1;
	return a;
}

static int open_event(struct perf_event_attr *a, int group)
{
	return perf_event_open(a, 0, -1, group, PERF_FLAG_FD_CLOEXEC);
}

/* Opens `a` alone; on failure reports it (as `name`) and returns -1. */
static int open_or_report(struct perf_event_attr *a, const char *name)
{
	int fd = open_event(a, -1);

	if (fd < 0)
		report(false, "%s: perf_event_open: %s", name, strerror(errno));
	return fd;
}

static uint64_t event_id(int fd)
{
	uint64_t id = 0;

	if (ioctl(fd, PERF_EVENT_IOC_ID, &id))
		return ~0ULL;
	return id;
}

/* read(2) with read_format TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING | ID. */
struct single_read {
	uint64_t value, enabled, running, id;
};

static bool read_single(int fd, struct single_read *r)
{
	return read(fd, r, sizeof(*r)) == (ssize_t)sizeof(*r);
}

/* read(2) with read_format GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING | ID. */
struct group_read {
	uint64_t nr, enabled, running;
	struct {
		uint64_t value, id;
	} values[3];
};

/* --- the PMU, as CPUID shows it ------------------------------------------------------------ */

static struct {
	bool expected; /* a PMU Linux drives: hardware events must open */
	bool architectural; /* architectural perfmon v2+: GLOBAL_CTRL starts a group at once */
	bool netburst;
	unsigned version, gp, gp_width, fixed;
	char why_none[200]; /* when hardware events are not there, why */
	char open_error[120]; /* perf_event_open's error for instructions:u, if it failed */
	bool hardware; /* hardware events open */
} pmu;

static void probe_pmu(void)
{
	unsigned a, b, c, d, max, family;
	char vendor[13];

	__cpuid(0, max, b, c, d);
	memcpy(vendor, &b, 4);
	memcpy(vendor + 4, &d, 4);
	memcpy(vendor + 8, &c, 4);
	vendor[12] = 0;
	__cpuid(1, a, b, c, d);
	family = (a >> 8) & 0xf;
	if (family == 0xf)
		family += (a >> 20) & 0xff;
	if (max >= 0xa) {
		__cpuid_count(0xa, 0, a, b, c, d);
		pmu.version = a & 0xff;
		pmu.gp = (a >> 8) & 0xff;
		pmu.gp_width = (a >> 16) & 0xff;
		pmu.fixed = pmu.version >= 2 ? (d & 0x1f) : 0;
	}
	pmu.netburst = !strcmp(vendor, "GenuineIntel") && family == 0xf && pmu.version == 0;
	pmu.architectural = pmu.version >= 2 && pmu.gp >= 1;
	pmu.expected = (pmu.version >= 1 && pmu.gp >= 1) || pmu.netburst;
	if (pmu.netburst)
		pmu.gp_width = 40; /* SDM 18.6.3: the NetBurst counters are 40 bits wide */
	printf("emon-perf-user: CPUID: %s family 0x%x, perfmon version %u, %u counters of %u bits, %u fixed%s\n", vendor,
	       family, pmu.version, pmu.gp, pmu.gp_width, pmu.fixed, pmu.netburst ? " (NetBurst)" : "");

	struct perf_event_attr at = attr_for(&instructions, USER);
	int fd = open_event(&at, -1);

	if (fd >= 0) {
		pmu.hardware = true;
		close(fd);
	} else {
		snprintf(pmu.open_error, sizeof(pmu.open_error), "perf_event_open(instructions:u): %s", strerror(errno));
	}
	if (!pmu.hardware && !pmu.expected)
		snprintf(pmu.why_none, sizeof(pmu.why_none),
			 "no hardware PMU: CPUID leaf 0xA shows version %u with %u counters; %s", pmu.version, pmu.gp,
			 pmu.open_error);
	printf("emon-perf-user: hardware events %s\n", pmu.hardware ? "open" : pmu.open_error);
}

/*
 * Whether a hardware test can run: SKIP (no PMU, as CPUID says) or FAIL (CPUID shows one and
 * perf_event_open refused) when it cannot.
 */
static bool hardware_or_report(const char *name)
{
	if (pmu.hardware)
		return true;
	if (!pmu.expected)
		skip(name, pmu.why_none);
	else
		report(false, "%s (CPUID shows a PMU, but %s)", name, pmu.open_error);
	return false;
}

/* --- counting ------------------------------------------------------------------------------- */

/* One counted run of n iterations through the event (or group leader) fd, from 0 (the whole
 * group's counts reset). */
static bool run_loop(int fd, unsigned long n)
{
	if (ioctl(fd, PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP))
		return false;
	return emon_enable_loop_disable(fd, n) == 0;
}

/* Per-iteration counts of the loop at :u: what each event is checked against. */
/* Linux 6.1's p4 driver: the first period of an event can be the counter's previous event's,
 * so a count read through perf is off by the difference (the counter and perf's own idea of it
 * disagree): a known failure under NetBurst, Linux's, for every check of a count's value. */
static const char *const p4_stale_period =
	"Linux 6.1's p4_pmu_set_period reloads the counter with its previous event's period: README, \"The NetBurst PMU\"";

/* report() for a check of a count's value (see p4_stale_period). */
#define report_count(ok, ...) report_kfail(pmu.netburst, (ok), p4_stale_period, __VA_ARGS__)

static uint64_t per_iteration(const struct event *e)
{
	return e == &instructions ? 2 : 1;
}

/*
 * E:u, E:k and E each opened alone: the loop difference at :u is exact for instructions and
 * branches and at least one cycle per iteration; :k counts the ioctls' kernel code; E counts at
 * least the loop in each run; read_format gives the event's id and enabled = running.
 */
static void test_alone(const struct event *e, enum mode m, uint64_t *intercept)
{
	char name[96];
	struct single_read r1, r2;
	struct perf_event_attr a = attr_for(e, m);
	int fd;

	snprintf(name, sizeof(name), "%s%s alone", e->name, suffix[m]);
	if (!hardware_or_report(name))
		return;
	fd = open_or_report(&a, name);
	if (fd < 0)
		return;
	bool ok = run_loop(fd, N1) && read_single(fd, &r1) && run_loop(fd, N2) && read_single(fd, &r2);
	uint64_t id = event_id(fd);

	close(fd);
	if (!report(ok, "%s: enable, loop, disable, read", name))
		return;
	note("%s: %llu after %lu iterations, %llu after %lu", name, (unsigned long long)r1.value, N1,
	     (unsigned long long)r2.value, N2);
	uint64_t diff = r2.value - r1.value, per = per_iteration(e);

	switch (m) {
	case USER:
		if (e == &cycles) {
			report_count(r2.value > r1.value && diff >= DN, "%s: at least 1 per loop iteration", name);
		} else {
			report_count(diff == per * DN, "%s: exactly %llu per loop iteration", name, (unsigned long long)per);
			*intercept = r1.value - per * N1;
			note("%s: %lld outside the loop (the enable/disable path)", name,
			     (long long)(r1.value - per * N1));
		}
		break;
	case KERNEL:
		report(r1.value > 0 && r2.value > 0, "%s: counts the ioctls' kernel code", name);
		break;
	case BOTH:
		/* Not the difference: the kernel code counted besides (interrupts) varies per run. */
		report_count(r1.value >= per * N1 && r2.value >= per * N2, "%s: at least the loop's %llu per iteration", name,
		       (unsigned long long)per);
		break;
	}
	report(r1.id == id && r2.id == id && r1.enabled == r1.running && r2.enabled == r2.running,
	       "%s: read_format ID and TOTAL_TIME_ENABLED = TOTAL_TIME_RUNNING", name);
	if (r1.enabled != r1.running || r2.enabled != r2.running || r1.id != id)
		note("%s: id %llu (ioctl: %llu), enabled %llu/%llu, running %llu/%llu", name,
		     (unsigned long long)r1.id, (unsigned long long)id, (unsigned long long)r1.enabled,
		     (unsigned long long)r2.enabled, (unsigned long long)r1.running, (unsigned long long)r2.running);
}

/*
 * {E, E:u, E:k} in one group, enabled and disabled through the leader: E = E:u + E:k at both
 * sizes, E:u's loop difference exact (instructions, branches), read_format GROUP's ids in order.
 */
static void test_group(const struct event *e)
{
	char name[96];
	int fds[3] = { -1, -1, -1 };
	uint64_t ids[3];
	struct group_read g[2];
	unsigned long sizes[2] = { N1, N2 };
	bool ok = true;

	snprintf(name, sizeof(name), "{%s, %s:u, %s:k} group", e->name, e->name, e->name);
	if (!hardware_or_report(name))
		return;
	for (int i = 0; i < 3 && ok; i++) {
		struct perf_event_attr a = attr_for(e, (enum mode)i);

		if (i == 0)
			a.read_format |= PERF_FORMAT_GROUP;
		else
			a.disabled = 0; /* on and off the PMU with the leader */
		fds[i] = open_event(&a, i ? fds[0] : -1);
		if (fds[i] < 0) {
			int err = errno;
			/* Three events of one kind need three counters that can count it. */
			bool fits = pmu.architectural && pmu.gp + (e != &branches && pmu.fixed > 0) >= 3;

			if (err == EINVAL && !fits) {
				char why[160];

				snprintf(why, sizeof(why),
					 "perf_event_open of the %s member: EINVAL: this PMU has no three counters for %s at once",
					 suffix[i][0] ? suffix[i] : "first", e->name);
				skip(name, why);
			} else {
				report(false, "%s: perf_event_open of member %d: %s", name, i, strerror(err));
			}
			ok = false;
		} else {
			ids[i] = event_id(fds[i]);
		}
	}
	for (int s = 0; s < 2 && ok; s++)
		ok = run_loop(fds[0], sizes[s]) && read(fds[0], &g[s], sizeof(g[s])) == (ssize_t)sizeof(g[s]);
	for (int i = 0; i < 3; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (fds[2] < 0)
		return;
	if (!report(ok, "%s: enable, loop, disable, read", name))
		return;
	bool format = true;

	for (int s = 0; s < 2; s++) {
		format = format && g[s].nr == 3 && g[s].enabled == g[s].running;
		for (int i = 0; i < 3; i++)
			format = format && g[s].values[i].id == ids[i];
		note("%s: %lu iterations: %s %llu, %s:u %llu, %s:k %llu", name, sizes[s], e->name,
		     (unsigned long long)g[s].values[0].value, e->name, (unsigned long long)g[s].values[1].value, e->name,
		     (unsigned long long)g[s].values[2].value);
	}
	report(format, "%s: read_format GROUP: 3 values, the members' ids in order, enabled = running", name);
	bool split = true;
	uint64_t slack = 0;

	for (int s = 0; s < 2; s++) {
		uint64_t both = g[s].values[0].value, u = g[s].values[1].value, k = g[s].values[2].value;

		if (pmu.architectural)
			split = split && both == u + k;
		else /* Linux's p4 driver starts and stops the counters one CCCR write at a time */
			split = split && (both > u + k ? both - u - k : u + k - both) <= 1000;
		slack = both > u + k ? both - u - k : u + k - both;
		split = split && u > 0 && k > 0;
	}
	if (pmu.architectural)
		report(split, "%s: %s = %s:u + %s:k exactly, both non-zero", name, e->name, e->name, e->name);
	else
		report(split, "%s: %s = %s:u + %s:k within the p4 driver's one-at-a-time enable (%llu apart)", name,
		       e->name, e->name, e->name, (unsigned long long)slack);
	uint64_t diff = g[1].values[1].value - g[0].values[1].value;

	if (e == &cycles)
		report(diff >= DN, "%s: %s:u at least 1 per loop iteration", name, e->name);
	else
		report(diff == per_iteration(e) * DN, "%s: %s:u exactly %llu per loop iteration", name, e->name,
		       (unsigned long long)per_iteration(e));
}

/* --- sampling ------------------------------------------------------------------------------- */

#define DATA_PAGES 16

struct ring {
	volatile struct perf_event_mmap_page *page;
	size_t mapped;
	const char *data;
	uint64_t size;
};

static bool ring_map(int fd, struct ring *r)
{
	long ps = sysconf(_SC_PAGESIZE);
	void *p;

	r->mapped = (size_t)ps * (1 + DATA_PAGES);
	p = mmap(NULL, r->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return false;
	r->page = p;
	r->data = (const char *)p + (r->page->data_offset ? r->page->data_offset : (uint64_t)ps);
	r->size = r->page->data_size ? r->page->data_size : (uint64_t)ps * DATA_PAGES;
	return true;
}

struct samples {
	uint64_t samples, in_loop, user, period_ok, ours, throttle, lost, other;
	uint64_t first_bad_ip;
	const char *begin, *end; /* the loop's instructions */
};

/* PERF_RECORD_SAMPLE with sample_type IP | TID | PERIOD. */
struct sample {
	struct perf_event_header header;
	uint64_t ip;
	uint32_t pid, tid;
	uint64_t period;
};

/* Reads every record between data_tail and data_head (the ring may wrap), as perf does. */
static void ring_drain(struct ring *r, uint64_t period, struct samples *s)
{
	uint64_t head = __atomic_load_n(&r->page->data_head, __ATOMIC_ACQUIRE);
	uint64_t tail = r->page->data_tail;
	pid_t pid = getpid(), tid = (pid_t)syscall(SYS_gettid);
	char buf[256];

	while (tail < head) {
		struct perf_event_header h;
		uint64_t at = tail % r->size;
		size_t n;

		for (size_t i = 0; i < sizeof(h); i++)
			((char *)&h)[i] = r->data[(at + i) % r->size];
		if (h.size < sizeof(h))
			break;
		n = h.size < sizeof(buf) ? h.size : sizeof(buf);
		for (size_t i = 0; i < n; i++)
			buf[i] = r->data[(at + i) % r->size];
		if (h.type == PERF_RECORD_SAMPLE && n >= sizeof(struct sample)) {
			struct sample x;

			memcpy(&x, buf, sizeof(x));
			s->samples++;
			if (x.ip >= (uint64_t)s->begin && x.ip < (uint64_t)s->end)
				s->in_loop++;
			else if (!s->first_bad_ip)
				s->first_bad_ip = x.ip;
			s->user += x.ip < (1ULL << 47);
			s->period_ok += x.period == period;
			s->ours += x.pid == (uint32_t)pid && x.tid == (uint32_t)tid;
		} else if (h.type == PERF_RECORD_THROTTLE) {
			s->throttle++;
		} else if (h.type == PERF_RECORD_LOST) {
			s->lost++;
		} else {
			s->other++;
		}
		tail += h.size;
	}
	__atomic_store_n(&r->page->data_tail, tail, __ATOMIC_RELEASE);
}

/* What Linux throttles sampling events by: printed, since a throttled event has fewer samples. */
static void print_throttling(void)
{
	const char *sysctls[] = { "perf_cpu_time_max_percent", "perf_event_max_sample_rate" };

	for (unsigned i = 0; i < 2; i++) {
		char path[80], value[32] = "?";
		int fd;
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/sys/kernel/%s", sysctls[i]);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			n = read(fd, value, sizeof(value) - 1);
			value[n > 0 ? n : 0] = 0;
			value[strcspn(value, "\n")] = 0;
			close(fd);
		}
		printf("emon-perf-user: %s = %s\n", path, value);
	}
}


/*
 * instructions:u sampling every PERIOD through the mmap ring buffer: samples = total / PERIOD,
 * every sample's IP in the loop, its period PERIOD and pid/tid ours; total as counted without
 * sampling.
 */
static void test_sampling_ring(uint64_t intercept)
{
	const char *name = "instructions:u sampling through the ring buffer";
	struct perf_event_attr a = attr_for(&instructions, USER);
	struct single_read r;
	struct ring ring;
	struct samples s = { .begin = emon_loop_begin, .end = emon_loop_end };
	int fd;

	if (!hardware_or_report(name))
		return;
	a.sample_period = PERIOD;
	a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_PERIOD;
	fd = open_or_report(&a, name);
	if (fd < 0)
		return;
	if (!ring_map(fd, &ring)) {
		report(false, "%s: mmap of 1 + %d pages: %s", name, DATA_PAGES, strerror(errno));
		close(fd);
		return;
	}
	bool ok = run_loop(fd, SAMPLED_N) && read_single(fd, &r);

	if (ok)
		ring_drain(&ring, PERIOD, &s);
	munmap((void *)ring.page, ring.mapped);
	close(fd);
	if (!report(ok, "%s: enable, loop, disable, read", name))
		return;
	uint64_t expected = r.value / PERIOD;

	note("%s: %llu instructions, %llu samples (%llu in the loop), %llu throttle, %llu lost, %llu other records",
	     name, (unsigned long long)r.value, (unsigned long long)s.samples, (unsigned long long)s.in_loop,
	     (unsigned long long)s.throttle, (unsigned long long)s.lost, (unsigned long long)s.other);
	report_count(r.value == 2 * SAMPLED_N + intercept, "%s: counts the loop and path as without sampling", name);
	report_count(s.samples == expected && s.throttle == 0 && s.lost == 0, "%s: one sample per %llu instructions",
		     name, PERIOD);
	if (s.first_bad_ip)
		note("%s: a sample at 0x%llx, outside the loop at %p..%p", name, (unsigned long long)s.first_bad_ip,
		     (void *)emon_loop_begin, (void *)emon_loop_end);
	report_count(s.samples > 0 && s.in_loop == s.samples, "%s: every sample's IP is in the loop", name);
	report_count(s.samples > 0 && s.period_ok == s.samples && s.ours == s.samples,
	       "%s: every sample has period %llu and our pid/tid", name, PERIOD);
}

static volatile sig_atomic_t signals, signals_bad;
static int signal_fd;

static void on_overflow(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	signals++;
	if (si->si_fd != signal_fd || si->si_code != POLL_IN)
		signals_bad++;
}

/* Overflow signals as perf's tests take them: O_ASYNC, F_SETSIG (a queued real-time signal, so
 * that none merge), F_SETOWN. Returns the descriptor, or -1 with errno. */
static int arm_signals(int fd, int sig)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_overflow;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	signals = 0;
	signals_bad = 0;
	signal_fd = fd;
	if (sigaction(sig, &sa, NULL) || fcntl(fd, F_SETFL, O_ASYNC) || fcntl(fd, F_SETSIG, sig) ||
	    fcntl(fd, F_SETOWN, getpid()))
		return -1;
	return fd;
}

/* Opens `a` with overflow signals `sig` armed; on failure reports it (as `name`) and returns -1. */
static int open_signalled(struct perf_event_attr *a, int sig, const char *name)
{
	int fd = open_event(a, -1);

	if (fd >= 0 && arm_signals(fd, sig) >= 0)
		return fd;
	report(false, "%s: perf_event_open/fcntl: %s", name, strerror(errno));
	if (fd >= 0)
		close(fd);
	return -1;
}

/* instructions:u sampling every PERIOD, taken as overflow signals: signals = total / PERIOD. */
static void test_sampling_signals(uint64_t intercept)
{
	const char *name = "instructions:u overflow signals";
	struct perf_event_attr a = attr_for(&instructions, USER);
	struct single_read r;
	int fd, sig = SIGRTMIN + 1;

	if (!hardware_or_report(name))
		return;
	a.sample_period = PERIOD;
	a.sample_type = PERF_SAMPLE_IP;
	a.wakeup_events = 1;
	fd = open_signalled(&a, sig, name);
	if (fd < 0)
		return;
	bool ok = run_loop(fd, SAMPLED_N) && read_single(fd, &r);

	close(fd);
	signal(sig, SIG_DFL);
	if (!report(ok, "%s: enable, loop, disable, read", name))
		return;
	note("%s: %llu instructions (%llu of them in the signal handler and sigreturn), %d signals", name,
	     (unsigned long long)r.value, (unsigned long long)(r.value - 2 * SAMPLED_N - intercept), (int)signals);
	report_count((uint64_t)signals == r.value / PERIOD, "%s: one signal per %llu instructions", name, PERIOD);
	report(signals > 0 && signals_bad == 0, "%s: every signal's si_fd is the event's, si_code POLL_IN", name);
}

/* --- rdpmc through the mmap page ------------------------------------------------------------ */

static uint64_t rdpmc(uint32_t counter)
{
	uint32_t lo, hi;

	asm volatile("rdpmc" : "=a"(lo), "=d"(hi) : "c"(counter));
	return lo | (uint64_t)hi << 32;
}

/*
 * perf's self-monitoring read (include/uapi/linux/perf_event.h, struct perf_event_mmap_page):
 * under the seqlock `lock`, offset plus the counter read with RDPMC (index - 1), sign-extended
 * from pmc_width bits, when cap_user_rdpmc and index say the event is on a counter.
 */
static inline uint64_t mmap_read(volatile struct perf_event_mmap_page *pc, unsigned *retries)
{
	for (;;) {
		uint32_t seq = pc->lock;

		asm volatile("" ::: "memory");
		uint32_t idx = pc->index;
		uint64_t count = pc->offset;

		if (pc->cap_user_rdpmc && idx) {
			unsigned width = pc->pmc_width;
			int64_t pmc = (int64_t)(rdpmc(idx - 1) << (64 - width));

			count += (uint64_t)(pmc >> (64 - width));
		}
		asm volatile("" ::: "memory");
		if (pc->lock == seq)
			return count;
		++*retries;
	}
}

/* The count difference over emon_known_loop(n), both reads through the mmap page. */
static __attribute__((noinline)) uint64_t rdpmc_loop(volatile struct perf_event_mmap_page *pc, unsigned long n,
						     unsigned *retries)
{
	uint64_t before = mmap_read(pc, retries);

	emon_known_loop(n);
	return mmap_read(pc, retries) - before;
}

/*
 * instructions:u read with RDPMC as perf's self-monitoring does: cap_user_rdpmc, index and
 * pmc_width (the counters' width, CPUID.0AH:EAX[23:16]) in the mmap page, the loop difference
 * exact, and the read after disabling equal to read(2).
 */
static void test_rdpmc(void)
{
	const char *name = "instructions:u read with rdpmc";
	struct perf_event_attr a = attr_for(&instructions, USER);
	struct single_read r;
	long ps = sysconf(_SC_PAGESIZE);
	volatile struct perf_event_mmap_page *pc;
	uint64_t d1 = 0, d2 = 0;
	unsigned retries = 0;
	int fd, tries;

	if (!hardware_or_report(name))
		return;
	fd = open_or_report(&a, name);
	if (fd < 0)
		return;
	pc = mmap(NULL, ps, PROT_READ, MAP_SHARED, fd, 0);
	if (pc == MAP_FAILED) {
		report(false, "%s: mmap of the event's first page: %s", name, strerror(errno));
		close(fd);
		return;
	}
	ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
	note("%s: cap_user_rdpmc %d, index 0x%x, pmc_width %d, cap_user_time %d", name, (int)pc->cap_user_rdpmc,
	     pc->index, (int)pc->pmc_width, (int)pc->cap_user_time);
	if (report(pc->cap_user_rdpmc && pc->index != 0, "%s: cap_user_rdpmc and an index while enabled", name)) {
		report(pc->pmc_width == pmu.gp_width, "%s: pmc_width is the counters' %u bits", name, pmu.gp_width);
		/* A retry of the seqlock runs more instructions: measure again (the page changes only
		 * when Linux reschedules the event). */
		for (tries = 0; tries < 5; tries++) {
			retries = 0;
			d1 = rdpmc_loop(pc, N1, &retries);
			d2 = rdpmc_loop(pc, N2, &retries);
			if (!retries)
				break;
		}
		note("%s: %llu over %lu iterations, %llu over %lu (%d seqlock retries)", name, (unsigned long long)d1,
		     N1, (unsigned long long)d2, N2, tries);
		report_count(!retries && d2 - d1 == 2 * DN, "%s: exactly 2 per loop iteration between two reads", name);
	}
	ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
	retries = 0;
	uint64_t page = mmap_read(pc, &retries);
	bool ok = read_single(fd, &r);

	note("%s: disabled: index 0x%x, mmap page read %llu, read(2) %llu", name, pc->index, (unsigned long long)page,
	     (unsigned long long)r.value);
	report(ok && pc->index == 0 && page == r.value, "%s: disabled, the mmap page's offset is read(2)'s count",
	       name);
	munmap((void *)pc, ps);
	close(fd);
}

/* --- software events ------------------------------------------------------------------------ */

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Runs the known loop for at least `seconds` of CLOCK_MONOTONIC; returns the time taken. */
static double loop_for(double seconds)
{
	double start = now_s(), t;

	do {
		emon_known_loop(100000);
		t = now_s() - start;
	} while (t < seconds);
	return t;
}

#define SW_SECONDS 0.05
#define TASK_CLOCK_PERIOD_NS 1000000ULL

/* task-clock counts the task's time: some, and no more than the CLOCK_MONOTONIC time from before
 * the enabling ioctl to after the disabling one (the event counts the kernel's paths of both,
 * which are slow where the host emulates kernel code) plus 10 ms (both clocks may tick in
 * jiffies, each read up to a tick off), enabled = running, and its mmap page offers no rdpmc. */
static void test_task_clock(void)
{
	const char *name = "task-clock alone";
	struct perf_event_attr a = attr_for(&task_clock, BOTH);
	struct single_read r;
	long ps = sysconf(_SC_PAGESIZE);
	int fd = open_or_report(&a, name);

	if (fd < 0)
		return;
	volatile struct perf_event_mmap_page *pc = mmap(NULL, ps, PROT_READ, MAP_SHARED, fd, 0);

	double before = now_s();

	ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
	loop_for(SW_SECONDS);
	ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);

	double t = now_s() - before;
	bool ok = read_single(fd, &r);

	note("%s: %llu ns over %.0f ms of CLOCK_MONOTONIC, enabled %llu, running %llu", name,
	     (unsigned long long)r.value, t * 1e3, (unsigned long long)r.enabled, (unsigned long long)r.running);
	report(ok && r.value > 0 && r.value <= t * 1e9 + 1e7 && r.enabled == r.running,
	       "%s: no more than the time the loop ran, enabled = running", name);
	report(pc != MAP_FAILED && !pc->cap_user_rdpmc && pc->index == 0,
	       "%s: its mmap page offers no rdpmc (index 0)", name);
	if (pc != MAP_FAILED)
		munmap((void *)pc, ps);
	close(fd);
}

/* page-faults: exactly one per fresh anonymous page written (no transparent huge pages). */
static void test_page_faults(void)
{
	const char *name = "page-faults alone";
	const size_t pages = 64;
	long ps = sysconf(_SC_PAGESIZE);
	struct perf_event_attr a = attr_for(&page_faults, BOTH);
	struct single_read r;
	uint64_t counts[2] = { 0, 0 };
	int fd = open_or_report(&a, name);

	if (fd < 0)
		return;
	/* The first round faults in this code's own pages too; the second is checked. */
	for (int round = 0; round < 2; round++) {
		volatile char *buf = mmap(NULL, pages * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (buf == MAP_FAILED) {
			report(false, "%s: mmap: %s", name, strerror(errno));
			close(fd);
			return;
		}
		madvise((void *)buf, pages * ps, MADV_NOHUGEPAGE);
		ioctl(fd, PERF_EVENT_IOC_RESET, 0);
		ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
		for (size_t i = 0; i < pages; i++)
			buf[i * ps] = 1;
		ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
		counts[round] = read_single(fd, &r) ? r.value : ~0ULL;
		munmap((void *)buf, pages * ps);
	}
	close(fd);
	note("%s: %llu and %llu faults writing %zu fresh pages", name, (unsigned long long)counts[0],
	     (unsigned long long)counts[1], pages);
	report(counts[1] == pages, "%s: one per fresh page written", name);
}

/* task-clock sampling every millisecond through the ring buffer, loosely: a hrtimer (at the
 * tick's resolution without high-resolution timers) gives at most one sample per period. */
static void test_task_clock_sampling(void)
{
	const char *name = "task-clock sampling through the ring buffer";
	struct perf_event_attr a = attr_for(&task_clock, USER);
	struct single_read r;
	struct ring ring;
	struct samples s = { .begin = (const char *)emon_known_loop, .end = emon_known_loop_end };
	int fd;

	a.sample_period = TASK_CLOCK_PERIOD_NS;
	a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_PERIOD;
	fd = open_event(&a, -1);
	if (fd < 0 || !ring_map(fd, &ring)) {
		report(false, "%s: perf_event_open/mmap: %s", name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
	loop_for(SW_SECONDS);
	ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
	bool ok = read_single(fd, &r);

	ring_drain(&ring, TASK_CLOCK_PERIOD_NS, &s);
	munmap((void *)ring.page, ring.mapped);
	close(fd);
	note("%s: %llu ns, %llu samples (%llu in the loop, %llu in user space), %llu lost", name,
	     (unsigned long long)r.value, (unsigned long long)s.samples, (unsigned long long)s.in_loop,
	     (unsigned long long)s.user, (unsigned long long)s.lost);
	report(ok && s.samples >= 1 && s.samples <= r.value / TASK_CLOCK_PERIOD_NS + 1 && s.lost == 0,
	       "%s: between 1 and one per period", name);
	report(s.samples > 0 && s.user == s.samples && s.in_loop > 0 && s.ours == s.samples,
	       "%s: user-space IPs, some in the loop, our pid/tid", name);
}

/* task-clock overflow signals, loosely: between 1 and one per period. */
static void test_task_clock_signals(void)
{
	const char *name = "task-clock overflow signals";
	struct perf_event_attr a = attr_for(&task_clock, USER);
	struct single_read r;
	int fd, sig = SIGRTMIN + 1;

	a.sample_period = TASK_CLOCK_PERIOD_NS;
	a.sample_type = PERF_SAMPLE_IP;
	a.wakeup_events = 1;
	fd = open_signalled(&a, sig, name);
	if (fd < 0)
		return;
	ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
	loop_for(SW_SECONDS);
	ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
	bool ok = read_single(fd, &r);

	close(fd);
	signal(sig, SIG_DFL);
	note("%s: %llu ns, %d signals", name, (unsigned long long)r.value, (int)signals);
	report(ok && signals >= 1 && (uint64_t)signals <= r.value / TASK_CLOCK_PERIOD_NS + 1 && signals_bad == 0,
	       "%s: between 1 and one per period, si_fd ours, si_code POLL_IN", name);
}

int main(void)
{
	uint64_t intercept = 0;
	const struct event *hw[] = { &instructions, &branches, &cycles };

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("emon-perf-user: perf_event_open from user space on a known loop (%lu and %lu iterations)\n", N1, N2);
	probe_pmu();
	for (unsigned i = 0; i < 3; i++) {
		uint64_t unused;

		test_alone(hw[i], USER, hw[i] == &instructions ? &intercept : &unused);
		test_alone(hw[i], KERNEL, &unused);
		test_alone(hw[i], BOTH, &unused);
		test_group(hw[i]);
	}
	print_throttling();
	test_sampling_ring(intercept);
	test_sampling_signals(intercept);
	test_rdpmc();
	test_task_clock();
	test_page_faults();
	test_task_clock_sampling();
	test_task_clock_signals();
	if (known_failures)
		printf("SUMMARY: %d tests, %d unexpected failures, %d known failures, %d skipped\n", tests, failures,
		       known_failures, skipped);
	else
		printf("SUMMARY: %d tests, %d unexpected failures, %d skipped\n", tests, failures, skipped);
	return failures ? 1 : 0;
}
