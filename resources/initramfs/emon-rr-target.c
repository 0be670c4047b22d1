/*
 * emon-rr-target: the small program the initramfs's rr test records and replays (README, "Linux
 * user space"). It makes system calls of several kinds (open, read, getpid, sigaction, setitimer,
 * write), raises SIGUSR1 three times (synchronous signals), and runs a loop of conditional
 * branches until SIGVTALRM has come three times: asynchronous signals that interrupt the loop
 * wherever it is, which rr records by its retired-conditional-branch count and replays by
 * counting to it and single-stepping the rest. What it prints depends on where they came, so a
 * replay that prints the same line has put them in the same places. The timer counts the
 * process's own user time (ITIMER_VIRTUAL), so the loop runs between signals however long rr
 * takes to handle each: a timer of real time shorter than that would interrupt the program
 * again before its next instruction, for ever.
 * `emon-rr-target sync`: no timer, 100,000 iterations.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t usr1, alarms;

static void on_usr1(int sig)
{
	(void)sig;
	usr1++;
}

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

int main(int argc, char **argv)
{
	int timer = !(argc > 1 && strcmp(argv[1], "sync") == 0);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_alarm;
	sigaction(SIGVTALRM, &sa, NULL);
	for (int i = 0; i < 3; i++)
		raise(SIGUSR1);

	char buf[64];
	int fd = open("/proc/self/stat", O_RDONLY);
	ssize_t got = fd < 0 ? -1 : read(fd, buf, sizeof buf);
	if (fd >= 0)
		close(fd);

	struct itimerval every = { { 0, 2000 }, { 0, 2000 } }, off;
	memset(&off, 0, sizeof off);
	if (timer)
		setitimer(ITIMER_VIRTUAL, &every, NULL);
	unsigned long x = 1, odd = 0, i;
	for (i = 0; i < (timer ? 20000000UL : 100000UL) && alarms < 3; i++) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		if (x >> 63)
			odd++;
	}
	setitimer(ITIMER_VIRTUAL, &off, NULL);
	printf("emon-rr-target: pid %d, read %zd bytes, %d SIGUSR1, %d SIGVTALRM, %lu iterations, x %lx, odd %lu\n",
	       (int)getpid(), got, (int)usr1, (int)alarms, i, x, odd);
	return !(usr1 == 3 && (alarms >= 1 || !timer) && got > 0);
}
