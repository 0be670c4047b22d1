#!/bin/sh
# emon-tools-test: Debian's perf inside the guest, on emon-loop's known loop, reported as
# kvm-unit-tests-style PASS/FAIL/SKIP lines and a SUMMARY (README, "Linux user space").
#
# - perf stat of `emon-loop N` at N = 001000 and 101000 (the same number of digits): the counts
#   differ by exactly 200,000 instructions:u and 100,000 branches:u;
# - perf record of instructions:u every 100,000 over a loop of 2,000,000 instructions: perf
#   script's sample IPs are all in the loop, one per period;
# - perf list names the hardware events;
# - rr records `emon-rr-target` and replays it to the same output;
# - with `--perf-test NAME,...`, perf's own tests whose names contain each NAME (`perf test NAME`),
#   one PASS/FAIL/SKIP line a test: e.g. the breakpoint and watchpoint tests, whose user code and
#   signal handlers run with the guest's debug registers armed.
# Without a PMU that Linux drives, perf stat reports the hardware events <not supported>, and the
# hardware tests are skipped with that reason.
tests=0 failures=0 known=0 skipped=0
report() { # report OK NAME
    tests=$((tests + 1))
    if [ "$1" -eq 0 ]; then echo "PASS: $2"; else echo "FAIL: $2"; failures=$((failures + 1)); fi
}
# On NetBurst, Linux 6.1's p4 driver reloads a counter with its previous event's period, so the
# counts perf reads are off by it: a known failure there, Linux's (README, "The NetBurst PMU").
netburst=0
grep -q '^cpu family[[:space:]]*: 15$' /proc/cpuinfo && netburst=1
report_count() { # report_count OK NAME: report, for a check of a count's value
    if [ "$1" -ne 0 ] && [ "$netburst" -eq 1 ]; then
        tests=$((tests + 1))
        known=$((known + 1))
        echo "KFAIL: $2 (Linux 6.1's p4_pmu_set_period reloads the counter with its previous event's period: README, \"The NetBurst PMU\")"
    else
        report "$1" "$2"
    fi
}
skip() { echo "SKIP: $1 ($2)"; skipped=$((skipped + 1)); }

perf_tests=""
if [ "${1:-}" = "--perf-test" ]; then
    perf_tests="$(echo "${2:?--perf-test needs a comma-separated list of test names}" | tr , ' ')"
fi

# Address-space randomisation moves the stack, and with it the C library's string functions'
# paths: off, so that runs differ only by the loop.
echo 0 >/proc/sys/kernel/randomize_va_space

# count EVENT N: the event's count over `emon-loop N` from perf stat's CSV output, or its text
# (<not supported>, <not counted>).
count() {
    perf stat -x, -e "$1" emon-loop "$2" 2>&1 >/dev/null | awk -F, -v e="$1" '$3 == e { print $1 }'
}

hardware=1
first="$(count instructions:u 001000)"
case "$first" in
    '' | *[!0-9]*) hardware=0 ;;
esac
if [ "$hardware" -eq 0 ]; then
    skip "perf stat instructions:u and branches:u of emon-loop" "perf stat reports ${first:-nothing}"
    skip "perf record of emon-loop" "no hardware events"
else
    for e in "instructions:u 2" "branches:u 1"; do
        set -- $e
        a="$(count "$1" 001000)"
        b="$(count "$1" 101000)"
        echo "  perf stat $1: $a over 1,000 iterations, $b over 101,000"
        report_count $([ "$((b - a))" -eq "$((100000 * $2))" ] && echo 0 || echo 1) \
            "perf stat $1 of emon-loop: exactly $2 per iteration"
    done
    period=100000
    perf record -q -e instructions:u -c "$period" -o /tmp/perf.data emon-loop 1000000 >/tmp/loop.out 2>/tmp/record.err
    status=$?
    report $status "perf record -e instructions:u -c $period of emon-loop"
    # perf's own SIGSEGV handler writes its backtrace to standard output, the workload's file.
    [ $status -eq 0 ] || sed "s/^/  perf record (status $status): /" /tmp/record.err /tmp/loop.out
    range="$(sed -n 's/^emon-loop: loop at \(0x[0-9a-f]*\)-\(0x[0-9a-f]*\)$/\1 \2/p' /tmp/loop.out)"
    perf script -i /tmp/perf.data -F ip 2>/dev/null >/tmp/ips
    total="$(count instructions:u 1000000)"
    echo "  perf record: $(wc -l </tmp/ips) samples, $total instructions, loop at $range"
    # busybox awk reads "0x..." strings as hexadecimal numbers.
    awk -v r="$range" 'BEGIN { split(r, a, " "); lo = a[1] + 0; hi = a[2] + 0 }
        { ip = ("0x" $1) + 0; n++; if (ip >= lo && ip <= hi) in_loop++ }
        END { exit !(n > 0 && in_loop == n) }' /tmp/ips
    report_count $? "perf script: every sample's IP is in emon-loop's loop"
    report_count $([ "$(wc -l </tmp/ips)" -eq "$((total / period))" ] && echo 0 || echo 1) \
        "perf record: one sample per $period instructions"
fi
perf list hw 2>/dev/null | grep -q "instructions" && [ "$hardware" -eq 1 ] || [ "$hardware" -eq 0 ]
report $? "perf list hw names the hardware events (or none without a PMU)"

# rr: record `emon-rr-target` (system calls, synchronous signals, and asynchronous ones wherever
# its loop is), then replay it: the replay prints what the recording printed. rr refuses a CPU
# whose PMU it does not know, no PMU, and Nehalem's under Linux 5.3 and later (which keeps a
# Nehalem counter's period at 32 or more, so rr's probe of PERF_EVENT_IOC_PERIOD with 1 fails, as
# on the real CPU): skipped with rr's reason.
rr record -n -o /tmp/rr-trace emon-rr-target >/tmp/rr.out 2>/tmp/rr.err
status=$?
why="$(grep -m1 -E 'No supported microarchitectures|CPU type .* unknown|Unable to open performance counter|PERF_EVENT_IOC_PERIOD' /tmp/rr.err |
    sed -e 's/^\[FATAL [^]]*\] //' -e 's/;.*//')"
if [ $status -ne 0 ] && [ -n "$why" ] && ! grep -q '^emon-rr-target:' /tmp/rr.out; then
    skip "rr record and replay of emon-rr-target" "rr: $why"
else
    report $status "rr record of emon-rr-target"
    [ $status -eq 0 ] || sed "s/^/  rr record (status $status): /" /tmp/rr.err
    sed 's/^/  recorded: /' /tmp/rr.out
    rr replay -a /tmp/rr-trace >/tmp/rr.replay 2>/tmp/rr.replay.err
    status=$?
    [ $status -eq 0 ] || sed "s/^/  rr replay (status $status): /" /tmp/rr.replay.err
    grep '^emon-rr-target:' /tmp/rr.replay | sed 's/^/  replayed: /'
    [ $status -eq 0 ] && grep -q '^emon-rr-target:' /tmp/rr.out && cmp -s /tmp/rr.out /tmp/rr.replay
    report $? "rr replay -a of emon-rr-target prints what the recording printed"
fi

# perf test NAME...: each result line (`N: description : Ok`, `: FAILED!`, `: Skip (why)`; a test
# with subtests prints its own line without a result), into a file, so without colours.
if [ -n "$perf_tests" ]; then
    # shellcheck disable=SC2086
    perf test $perf_tests >/tmp/perf-test.out 2>&1
    sed 's/^/  perf test: /' /tmp/perf-test.out
    while IFS= read -r line; do
        name="$(echo "$line" | sed -n 's/^ *\([0-9.]*: .*[^ ]\) *: \(Ok\|FAILED!\|Skip.*\)$/\1/p')"
        [ -n "$name" ] || continue
        case "$line" in
            *": Ok") report 0 "perf test $name" ;;
            *": FAILED!") report 1 "perf test $name" ;;
            *) skip "perf test $name" "$(echo "$line" | sed -n 's/.*: Skip *(\(.*\))$/\1/p')" ;;
        esac
    done </tmp/perf-test.out
fi

echo "SUMMARY: $tests tests, $failures unexpected failures, $known known failures, $skipped skipped"
[ "$failures" -eq 0 ]
