/*
 * emon-seed: credits the kernel's random pool with the seed the image was built with
 * (/etc/emon-random-seed, 64 bytes from the build machine's /dev/urandom), as a distribution's
 * boot credits its saved random seed, so that the pool is ready when /init starts (README,
 * "Linux user space").
 *
 * Without it Linux gathers the entropy itself: where the host emulates kernel code that takes
 * minutes of a run (the kernel's `random: crng init done` came at 85 s of guest time), and
 * getrandom() without GRND_NONBLOCK and /dev/random wait for it (rr's start-up did), while the C
 * library takes another path until then. The seed is the same at every boot of an image, so
 * the kernel's random numbers are too.
 */
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define SEED "/etc/emon-random-seed"
#define SEED_BYTES 64

int main(void)
{
	/* struct rand_pool_info, then its buffer (a flexible array member of 32-bit words). */
	union {
		struct rand_pool_info info;
		unsigned char raw[sizeof(struct rand_pool_info) + SEED_BYTES];
	} s;
	int in = open(SEED, O_RDONLY);
	ssize_t n = in < 0 ? -1 : read(in, s.raw + sizeof(s.info), SEED_BYTES);

	if (n != SEED_BYTES) {
		fprintf(stderr, "emon-seed: cannot read %d bytes from %s\n", SEED_BYTES, SEED);
		return 1;
	}
	s.info.entropy_count = SEED_BYTES * 8;
	s.info.buf_size = SEED_BYTES;
	int pool = open("/dev/urandom", O_WRONLY);
	if (pool < 0 || ioctl(pool, RNDADDENTROPY, &s.info) != 0) {
		perror("emon-seed: RNDADDENTROPY on /dev/urandom");
		return 1;
	}
	return 0;
}
