// SPDX-License-Identifier: GPL-2.0
/*
 * emon_exit: user space ends the run with a status. Writing a number to
 * /sys/module/emon_exit/parameters/code waits until the console's tty has sent what user space
 * wrote to it (the 8250 driver sends its buffer a FIFO at a time, on transmit interrupts), then
 * writes the number with outl to the debug-exit port 0xF4, where emon ends the run with it as its
 * exit status (QEMU's isa-debug-exit with (code << 1) | 1).
 *
 * The kernel does the port write, so it needs neither I/O privileges in user mode (ioperm) nor a
 * /dev/port; the initramfs's /init ends every run through it (README, "Linux user space"). The
 * parameter acts only once the system runs init: a value given on the kernel command line is
 * refused instead of ending the boot.
 */
#include <linux/console.h>
#include <linux/init.h>
#include <linux/io.h>
#include <linux/kernel.h>
#include <linux/moduleparam.h>
#include <linux/tty.h>
#include <linux/tty_driver.h>

#define EXIT_PORT 0xf4

/* Waits, at most a second, until the console's tty has no output pending. */
static void drain_console(void)
{
	struct tty_driver *driver;
	struct tty_struct *tty;
	int index;

	driver = console_device(&index);
	if (!driver)
		return;
	tty = tty_kopen_shared(MKDEV(driver->major, driver->minor_start) + index);
	if (IS_ERR_OR_NULL(tty))
		return;
	tty_wait_until_sent(tty, HZ);
	tty_kref_put(tty);
}

static int emon_exit_set(const char *val, const struct kernel_param *kp)
{
	u32 code;
	int err;

	if (system_state != SYSTEM_RUNNING)
		return -EBUSY;
	err = kstrtou32(val, 0, &code);
	if (err)
		return err;
	drain_console();
	pr_info("emon_exit: writing %u to port 0x%x\n", code, EXIT_PORT);
	outl(code, EXIT_PORT);
	return 0;
}

static const struct kernel_param_ops emon_exit_ops = {
	.set = emon_exit_set,
};

module_param_cb(code, &emon_exit_ops, NULL, 0200);
