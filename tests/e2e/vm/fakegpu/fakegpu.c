// SPDX-License-Identifier: GPL-2.0
/*
 * gputuned_fakegpu: PCI functions of the e2e guest read as GPUs, with the NVIDIA driver's
 * device nodes.
 *
 * QEMU emulates no device that both has a GPU's identity (class 0x03, vendor NVIDIA or AMD)
 * and a PCI Express capability, and gputuned tunes PCIe only on GPUs' paths. This module gives
 * up to four functions (bdf=, a comma-separated list) that identity where gputuned (and lspci)
 * look for it:
 *
 * - config space: it wraps the config accessors of each function's bus (pci_bus_set_ops, as
 *   drivers/pci/pcie/aer_inject.c does) and changes exactly two dwords as they are read, the
 *   vendor/device ID (0x00) and the class code (0x08; the revision byte stays real);
 * - sysfs vendor, device and class attributes: it sets those fields of the kernel's pci_dev.
 *
 * Every other register - the PCIe capability with DevCap/DevCtl/LnkCap/LnkCtl/LnkSta, MSI-X,
 * the extended capabilities - and every write go to QEMU's device untouched. The driver bound
 * at enumeration (e1000e) stays bound and keeps the device working; its MSI-X vectors are the
 * "GPU's" interrupts. Unloading the module puts everything back.
 *
 * As the NVIDIA driver does, it registers character major 195 with one minor per GPU, in the
 * order of bdf= (devtmpfs makes /dev/nvidia0, /dev/nvidia1, ...: open and close succeed, so a
 * process that "uses GPU N" holds a real descriptor of 195:N), and lists each GPU's minor in
 * /proc/driver/nvidia/gpus/BDF/information ("Device Minor:"), where gputuned maps minors to
 * PCI functions on a host without NVML.
 *
 * Loaded after e1000e has bound (tests/e2e/vm/guest/gputuned-vm-gpu-up.service, before
 * gputuned.service): loaded earlier, e1000e would not match the device.
 */
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>

#define MAX_GPUS 4
#define NVIDIA_MAJOR 195

static char *bdf[MAX_GPUS] = { "0000:04:00.0" };
static int nr_bdf = 1;
module_param_array(bdf, charp, &nr_bdf, 0444);
MODULE_PARM_DESC(bdf, "functions to present as GPUs (domain:bus:device.function, comma-separated)");
static ushort vendor = 0x10de;
module_param(vendor, ushort, 0444);
MODULE_PARM_DESC(vendor, "vendor ID they read as (default NVIDIA)");
static ushort device = 0x2335;
module_param(device, ushort, 0444);
MODULE_PARM_DESC(device, "device ID they read as (default 0x2335, H200)");
static uint class_code = 0x030200;
module_param(class_code, uint, 0444);
MODULE_PARM_DESC(class_code, "class code they read as (default 3D controller)");

struct fake_gpu {
	struct pci_dev *pdev;
	unsigned short orig_vendor, orig_device;
	unsigned int orig_class;
};

struct wrapped_bus {
	struct pci_bus *bus;
	struct pci_ops *orig_ops;
};

static struct fake_gpu gpus[MAX_GPUS];
static int nr_gpus;
static struct wrapped_bus buses[MAX_GPUS];
static int nr_buses;
static struct cdev nv_cdev;
static struct class *nv_class;
static struct proc_dir_entry *proc_nvidia;
static bool chrdev_done;

static struct wrapped_bus *find_bus(struct pci_bus *bus)
{
	int i;

	for (i = 0; i < nr_buses; i++)
		if (buses[i].bus == bus)
			return &buses[i];
	return NULL;
}

static bool is_fake(struct pci_bus *bus, unsigned int devfn)
{
	int i;

	for (i = 0; i < nr_gpus; i++)
		if (gpus[i].pdev->bus == bus && gpus[i].pdev->devfn == devfn)
			return true;
	return false;
}

static int shim_read(struct pci_bus *bus, unsigned int devfn, int where, int size, u32 *val)
{
	struct pci_ops *ops = find_bus(bus)->orig_ops;
	int base = where & ~3, shift = (where & 3) * 8;
	u32 dword;
	int ret;

	if (!is_fake(bus, devfn) || (base != PCI_VENDOR_ID && base != PCI_CLASS_REVISION))
		return ops->read(bus, devfn, where, size, val);
	ret = ops->read(bus, devfn, base, 4, &dword);
	if (ret)
		return ret;
	if (base == PCI_VENDOR_ID)
		dword = ((u32)device << 16) | vendor;
	else
		dword = (class_code << 8) | (dword & 0xff);
	dword >>= shift;
	*val = size == 4 ? dword : dword & ((1u << (size * 8)) - 1);
	return PCIBIOS_SUCCESSFUL;
}

static int shim_write(struct pci_bus *bus, unsigned int devfn, int where, int size, u32 val)
{
	return find_bus(bus)->orig_ops->write(bus, devfn, where, size, val);
}

static struct pci_ops shim_ops = {
	.read = shim_read,
	.write = shim_write,
};

static int nv_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nv_open,
	.llseek = noop_llseek,
};

static int info_show(struct seq_file *m, void *v)
{
	long i = (long)m->private;

	seq_printf(m, "Model: \t\t gputuned fake GPU\nBus Location: \t %s\nDevice Minor: \t %ld\n",
		   pci_name(gpus[i].pdev), i);
	return 0;
}

static void undo(void)
{
	int i;

	if (proc_nvidia)
		proc_remove(proc_nvidia);
	if (nv_class) {
		for (i = 0; i < nr_gpus; i++)
			device_destroy(nv_class, MKDEV(NVIDIA_MAJOR, i));
		class_destroy(nv_class);
	}
	if (chrdev_done) {
		cdev_del(&nv_cdev);
		unregister_chrdev_region(MKDEV(NVIDIA_MAJOR, 0), nr_gpus);
	}
	for (i = nr_buses - 1; i >= 0; i--)
		pci_bus_set_ops(buses[i].bus, buses[i].orig_ops);
	for (i = 0; i < nr_gpus; i++) {
		gpus[i].pdev->vendor = gpus[i].orig_vendor;
		gpus[i].pdev->device = gpus[i].orig_device;
		gpus[i].pdev->class = gpus[i].orig_class;
		pci_dev_put(gpus[i].pdev);
	}
}

static int fake_one(const char *name)
{
	unsigned int dom, busnr, dev, fn;
	struct pci_dev *pdev;
	struct fake_gpu *g = &gpus[nr_gpus];

	if (sscanf(name, "%x:%x:%x.%x", &dom, &busnr, &dev, &fn) != 4)
		return -EINVAL;
	pdev = pci_get_domain_bus_and_slot(dom, busnr, PCI_DEVFN(dev, fn));
	if (!pdev) {
		pr_err("gputuned_fakegpu: no PCI function %s\n", name);
		return -ENODEV;
	}
	g->pdev = pdev; /* the reference is kept until unload */
	g->orig_vendor = pdev->vendor;
	g->orig_device = pdev->device;
	g->orig_class = pdev->class;
	nr_gpus++;
	if (!find_bus(pdev->bus)) {
		buses[nr_buses].bus = pdev->bus;
		buses[nr_buses].orig_ops = pci_bus_set_ops(pdev->bus, &shim_ops);
		nr_buses++;
	}
	pdev->vendor = vendor;
	pdev->device = device;
	pdev->class = class_code;
	pr_info("gputuned_fakegpu: %s (%04x:%04x class %06x) reads as %04x:%04x class %06x, /dev/nvidia%d\n",
		name, g->orig_vendor, g->orig_device, g->orig_class, vendor, device, class_code,
		nr_gpus - 1);
	return 0;
}

static int device_nodes(void)
{
	struct proc_dir_entry *dir, *gpudir;
	int ret, i;

	ret = register_chrdev_region(MKDEV(NVIDIA_MAJOR, 0), nr_gpus, "nvidia");
	if (ret)
		return ret;
	cdev_init(&nv_cdev, &nv_fops);
	ret = cdev_add(&nv_cdev, MKDEV(NVIDIA_MAJOR, 0), nr_gpus);
	if (ret) {
		unregister_chrdev_region(MKDEV(NVIDIA_MAJOR, 0), nr_gpus);
		return ret;
	}
	chrdev_done = true;
	nv_class = class_create("gputuned_fakegpu");
	if (IS_ERR(nv_class)) {
		ret = PTR_ERR(nv_class);
		nv_class = NULL;
		return ret;
	}
	for (i = 0; i < nr_gpus; i++) {
		struct device *d = device_create(nv_class, NULL, MKDEV(NVIDIA_MAJOR, i), NULL,
						 "nvidia%d", i);

		if (IS_ERR(d))
			return PTR_ERR(d);
	}
	proc_nvidia = proc_mkdir("driver/nvidia", NULL);
	gpudir = proc_nvidia ? proc_mkdir("gpus", proc_nvidia) : NULL;
	if (!gpudir)
		return -ENOMEM;
	for (i = 0; i < nr_gpus; i++) {
		dir = proc_mkdir(pci_name(gpus[i].pdev), gpudir);
		if (!dir || !proc_create_single_data("information", 0444, dir, info_show,
						     (void *)(long)i))
			return -ENOMEM;
	}
	return 0;
}

static int __init shim_init(void)
{
	int ret = 0, i;

	for (i = 0; i < nr_bdf && !ret; i++)
		ret = fake_one(bdf[i]);
	if (!ret)
		ret = device_nodes();
	if (ret)
		undo();
	return ret;
}

static void __exit shim_exit(void)
{
	undo();
}

module_init(shim_init);
module_exit(shim_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gputuned e2e: PCI functions read as GPUs, with /dev/nvidiaN nodes");
