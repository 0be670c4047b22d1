// SPDX-License-Identifier: GPL-2.0
/*
 * emon's perf self-test, built into emon's Linux test kernel (scripts/linux-kernel copies it to
 * drivers/emon/). At late init it counts a known loop with the kernel's perf API:
 *
 *   - instructions, branches and cycles of `1: dec; jnz 1b` run N times (2N instructions, N
 *     branches), each read with interrupts off around the loop;
 *   - a sampling instructions event whose overflow callbacks (PMIs, delivered as NMIs through
 *     LVTPC) are counted: one per sample period of the event's total count.
 *
 * It prints kvm-unit-tests-style lines, "PASS: name", "FAIL: name", "SKIP: name" and
 * "SUMMARY: T tests, F unexpected failures, S skipped", then writes 0 (all passed) or 1 to the
 * debug-exit port 0xF4 with outl. Boot with emon_perf_test.exit=0 to go on booting instead, and
 * with emon_perf_test.run=0 not to run it (the initramfs's user-space tests count for themselves).
 */
#include <linux/atomic.h>
#include <linux/init.h>
#include <linux/io.h>
#include <linux/irqflags.h>
#include <linux/kernel.h>
#include <linux/math64.h>
#include <linux/moduleparam.h>
#include <linux/perf_event.h>
#include <linux/smp.h>

#define LOOP_N 100000UL
#define SAMPLE_PERIOD 10000ULL
#define EXIT_PORT 0xf4
/* hw.interrupts of an event perf has throttled (perf's own MAX_INTERRUPTS, private to perf). */
#define PERF_THROTTLED (~0ULL)

static bool exit_port = true;
module_param_named(exit, exit_port, bool, 0444);
static bool run = true;
module_param(run, bool, 0444);

static int tests, failures, skipped;

static void report(bool pass, const char *name, u64 value, u64 lo, u64 hi)
{
	tests++;
	if (!pass)
		failures++;
	pr_info("%s: %s (%llu, expected %llu..%llu)\n", pass ? "PASS" : "FAIL", name, value, lo, hi);
}

static void skip(const char *name, long err)
{
	skipped++;
	pr_info("SKIP: %s: no such hardware event (error %ld)\n", name, err);
}

/* Exactly 2n instructions and n branches. */
static noinline void known_loop(unsigned long n)
{
	asm volatile("1: dec %0\n\tjnz 1b" : "+r"(n) : : "cc");
}

static atomic_t overflows = ATOMIC_INIT(0);

static void overflow_handler(struct perf_event *event, struct perf_sample_data *data,
			     struct pt_regs *regs)
{
	atomic_inc(&overflows);
}

static struct perf_event *open_event(u32 type, u64 config, u64 period,
				     perf_overflow_handler_t handler)
{
	struct perf_event_attr attr = {
		.type = type,
		.size = sizeof(attr),
		.config = config,
		.sample_period = period,
		.pinned = 1,
		.exclude_user = 1,
		.exclude_hv = 1,
		.exclude_idle = 1,
	};

	return perf_event_create_kernel_counter(&attr, raw_smp_processor_id(), NULL, handler,
						NULL);
}

/* The count of one run of the loop, read with interrupts off; false if a read failed. */
static bool count_loop(struct perf_event *event, unsigned long n, u64 *delta)
{
	unsigned long flags;
	u64 before = 0, after = 0;
	int err1, err2;

	local_irq_save(flags);
	err1 = perf_event_read_local(event, &before, NULL, NULL);
	known_loop(n);
	err2 = perf_event_read_local(event, &after, NULL, NULL);
	local_irq_restore(flags);
	if (err1 || err2) {
		pr_info("emon-perf-test: perf_event_read_local failed: %d %d\n", err1, err2);
		return false;
	}
	*delta = after - before;
	return true;
}

static void test_count(const char *name, u64 config, u64 lo, u64 hi)
{
	struct perf_event *event;
	u64 delta = 0;
	bool ok;

	event = open_event(PERF_TYPE_HARDWARE, config, 0, NULL);
	if (IS_ERR(event)) {
		skip(name, PTR_ERR(event));
		return;
	}
	ok = count_loop(event, LOOP_N, &delta);
	report(ok && delta >= lo && delta <= hi, name, delta, lo, hi);
	perf_event_release_kernel(event);
}

/*
 * One overflow callback per SAMPLE_PERIOD events counted: the event's total count, read at the
 * end, says how many there must be, whatever else (interrupts, the PMI handler's entry) it
 * counted besides the loop.
 */
static void test_sampling(void)
{
	const char *name = "instructions sampling: overflow callbacks";
	struct perf_event *event;
	unsigned long flags;
	u64 total, enabled, running, expected;
	bool throttled;
	int got;

	/* From its creation on, the event counts whatever runs (interrupts included). */
	atomic_set(&overflows, 0);
	event = open_event(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, SAMPLE_PERIOD,
			   overflow_handler);
	if (IS_ERR(event)) {
		skip(name, PTR_ERR(event));
		return;
	}
	local_irq_save(flags);
	known_loop(LOOP_N);
	/*
	 * perf stops an event whose PMIs seem to take too long (perf_sample_event_took, timed with
	 * sched_clock) until the next tick, which cannot come while interrupts are off. A guest
	 * whose TSC jumps forward after counted code (a host that cannot set it: README, "Guest
	 * time") looks so to Linux when sched_clock runs on the TSC.
	 */
	throttled = READ_ONCE(event->hw.interrupts) == PERF_THROTTLED;
	perf_event_disable_local(event);
	local_irq_restore(flags);
	got = atomic_read(&overflows);
	total = perf_event_read_value(event, &enabled, &running);
	expected = div64_u64(total, SAMPLE_PERIOD);
	if (throttled) {
		skipped++;
		pr_info("SKIP: instructions sampling: the loop was counted: perf throttled the event after %llu instructions\n",
			total);
	} else {
		report(total >= 2 * LOOP_N, "instructions sampling: the loop was counted", total,
		       2 * LOOP_N, U64_MAX);
	}
	report(got == expected, name, got, expected, expected);
	perf_event_release_kernel(event);
}

static int __init emon_perf_test(void)
{
	u64 n = LOOP_N, slack = LOOP_N / 100 + 1000;
	int code;

	if (!run)
		return 0;
	pr_info("emon-perf-test: counting %lu iterations of dec/jnz on CPU %d\n", LOOP_N,
		raw_smp_processor_id());
	test_count("instructions", PERF_COUNT_HW_INSTRUCTIONS, 2 * n, 2 * n + 2 * slack);
	test_count("branches", PERF_COUNT_HW_BRANCH_INSTRUCTIONS, n, n + slack);
	test_count("cycles", PERF_COUNT_HW_CPU_CYCLES, 1, U64_MAX);
	test_sampling();

	pr_info("SUMMARY: %d tests, %d unexpected failures, %d skipped\n", tests, failures,
		skipped);
	code = failures ? 1 : 0;
	if (exit_port) {
		pr_info("emon-perf-test: writing %d to port 0x%x\n", code, EXIT_PORT);
		outl(code, EXIT_PORT);
	}
	return 0;
}
late_initcall(emon_perf_test);
