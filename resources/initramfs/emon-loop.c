/*
 * emon-loop N: runs a known user-mode loop N times (dec; jnz: 2N instructions, N branches) and
 * prints where the loop is, so that a tool's samples can be checked against it: the program the
 * initramfs's tool tests measure with perf (README, "Linux user space").
 *
 * Everything else the program runs (the static C library's start-up, the parsing of N, the
 * printing) is the same for any N of the same number of digits with address-space randomisation
 * off, so two runs differ by exactly 2 (N2 - N1) instructions and N2 - N1 branches at :u.
 */
#include <stdio.h>
#include <stdlib.h>

void emon_loop(unsigned long n);
extern const char emon_loop_end[];
asm(".text\n"
    ".globl emon_loop\n"
    ".type emon_loop, @function\n"
    "emon_loop:\n"
    "1:	dec %rdi\n"
    "	jnz 1b\n"
    ".globl emon_loop_end\n"
    "emon_loop_end:\n"
    "	ret\n"
    ".size emon_loop, .-emon_loop\n");

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 0;

	if (n == 0) {
		fprintf(stderr, "usage: emon-loop N (N >= 1)\n");
		return 2;
	}
	emon_loop(n);
	printf("emon-loop: loop at %p-%p\n", (void *)emon_loop, (void *)emon_loop_end);
	return 0;
}
