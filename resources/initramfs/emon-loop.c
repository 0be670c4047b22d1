/*
 * emon-loop N: runs a known user-mode loop N times (dec; jnz: 2N instructions, N branches) and
 * prints where the loop is, so that a tool's samples can be checked against it: the program the
 * initramfs's tool tests measure with perf (README, "Linux user space").
 *
 * Everything else the program runs (the static C library's start-up, the parsing of N, the
 * printing) is the same for any N of the same number of digits with address-space randomisation
 * off, so two runs differ by exactly 2 (N2 - N1) instructions and N2 - N1 branches at :u.
 * That needs a start-up that does not depend on the kernel's state: the C library's malloc
 * asks getrandom(GRND_NONBLOCK) for its tcache key when it starts (the static start-up mallocs
 * before main) and takes another path while the kernel's random pool is not ready, so a run
 * before "random: crng init done" would retire other instructions than one after it. The
 * program brings its own malloc (a bump allocator over a static arena; glibc's manual,
 * "Replacing malloc", lists what a static program must define), and prints without stdio.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Alignas(64) unsigned char arena[1 << 20];
static size_t used;

/* Each block is preceded by its size, 16 bytes before it (at least 16-aligned, as malloc's). */
static void *take(size_t align, size_t size)
{
	size_t at = (used + 16 + align - 1) & ~(align - 1);

	if (align < 16 || size > sizeof(arena) || at + size > sizeof(arena)) {
		errno = ENOMEM;
		return NULL;
	}
	*(size_t *)(arena + at - 16) = size;
	used = at + size;
	return arena + at;
}

void *malloc(size_t size) { return take(16, size); }
void free(void *p) { (void)p; }
void *calloc(size_t n, size_t size) { return n && size > SIZE_MAX / n ? NULL : take(16, n * size); }
void *memalign(size_t align, size_t size) { return take(align < 16 ? 16 : align, size); }
void *aligned_alloc(size_t align, size_t size) { return memalign(align, size); }
void *valloc(size_t size) { return memalign(4096, size); }
void *pvalloc(size_t size) { return memalign(4096, (size + 4095) & ~(size_t)4095); }
size_t malloc_usable_size(void *p) { return p ? *(size_t *)((unsigned char *)p - 16) : 0; }

int posix_memalign(void **out, size_t align, size_t size)
{
	void *p = memalign(align, size);

	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *realloc(void *p, size_t size)
{
	void *q = malloc(size);
	size_t old = malloc_usable_size(p);

	if (q && p)
		memcpy(q, p, old < size ? old : size);
	return q;
}

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
	char line[80];
	int len = snprintf(line, sizeof(line), "emon-loop: loop at %p-%p\n", (void *)emon_loop, (void *)emon_loop_end);
	return write(1, line, (size_t)len) == len ? 0 : 1;
}
