/*
 * emon-timing [NAME [N]]: times, inside a Linux guest, the kinds of work whose cost is the
 * kernel's trips under emon rather than the code itself (README, "Linux user space's trips into
 * the kernel"): a system call, the vDSO's clock_gettime(), a first touch of an anonymous page,
 * reading /proc/self/maps, open + read + close, a copy-on-write fault in a forked child, fork +
 * exit + wait, and a plain user loop for scale. Each line is "NAME  T ns/op (N ops)", timed
 * with CLOCK_MONOTONIC. NAME runs only the kinds whose name contains it; N (default 2000) sets
 * the count of the system call, page and copy-on-write loops.
 *
 * It is not in the initramfs (each byte of the image costs boot time where the host emulates
 * kernel code); add it to an image:
 *
 *   gcc -static -O2 -s -o emon-timing resources/bench/emon-timing.c
 *   scripts/linux-initramfs --add ./emon-timing
 *   emon run --profile skylake --memory 256 --initrd <the image> target/emon-linux/vmlinux -- \
 *       console=ttyS0 emon_perf_test.run=0 -- emon-timing
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void report(const char *name, long long ops, long long since)
{
	printf("%-28s %8lld ns/op (%lld ops)\n", name, (now_ns() - since) / ops, ops);
	fflush(stdout);
}

static int wanted(const char *only, const char *name)
{
	return !*only || strstr(name, only) != NULL;
}

int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : "";
	long n = argc > 2 ? atol(argv[2]) : 2000;
	char buf[8192];
	long long t;
	long i;

	if (wanted(only, "getpid")) {
		t = now_ns();
		for (i = 0; i < n; i++)
			syscall(SYS_getpid);
		report("getpid", n, t);
	}
	if (wanted(only, "clock_gettime(vdso)")) {
		struct timespec ts;
		t = now_ns();
		for (i = 0; i < 2000; i++)
			clock_gettime(CLOCK_MONOTONIC, &ts);
		report("clock_gettime(vdso)", 2000, t);
	}
	char *pages = mmap(NULL, 4096 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (pages == MAP_FAILED) {
		perror("emon-timing: mmap");
		return 1;
	}
	if (wanted(only, "anon page fault")) {
		t = now_ns();
		for (i = 0; i < n; i++)
			pages[i * 4096] = 1;
		report("anon page fault", n, t);
	}
	if (wanted(only, "read /proc/self/maps")) {
		t = now_ns();
		for (i = 0; i < 200; i++) {
			int fd = open("/proc/self/maps", O_RDONLY);
			while (read(fd, buf, sizeof buf) > 0)
				;
			close(fd);
		}
		report("read /proc/self/maps", 200, t);
	}
	if (wanted(only, "open+read4k+close")) {
		t = now_ns();
		for (i = 0; i < 200; i++) {
			int fd = open("/bin/busybox", O_RDONLY);
			if (read(fd, buf, 4096) < 0)
				perror("emon-timing: read");
			close(fd);
		}
		report("open+read4k+close", 200, t);
	}
	if (wanted(only, "COW fault in child")) {
		t = now_ns();
		pid_t child = fork();
		if (child == 0) {
			long long t2 = now_ns();
			for (i = 0; i < n; i++)
				pages[i * 4096] = 2;
			report("COW fault in child", n, t2);
			_exit(0);
		}
		waitpid(child, NULL, 0);
		report("fork+child+wait", 1, t);
	}
	if (wanted(only, "fork+exit+wait")) {
		t = now_ns();
		for (i = 0; i < 20; i++) {
			pid_t child = fork();
			if (child == 0)
				_exit(0);
			waitpid(child, NULL, 0);
		}
		report("fork+exit+wait", 20, t);
	}
	volatile long x = 0;
	t = now_ns();
	for (i = 0; i < 10000000; i++)
		x += i;
	report("user loop iter", 10000000, t);
	return 0;
}
