// SPDX-License-Identifier: GPL-2.0
/*
 * gputuned_fakegpu: one PCI function of the e2e guest reads as a GPU in its config header.
 *
 * QEMU emulates no device that both has a GPU's identity (class 0x03, vendor NVIDIA or AMD)
 * and a PCI Express capability, and gputuned tunes PCIe only on GPUs' paths. This module gives
 * one function that identity where gputuned (and lspci) look for it:
 *
 * - config space: it wraps the config accessors of the function's bus (pci_bus_set_ops, as
 *   drivers/pci/pcie/aer_inject.c does) and changes exactly two dwords as they are read, the
 *   vendor/device ID (0x00) and the class code (0x08; the revision byte stays real);
 * - sysfs vendor, device and class attributes: it sets those fields of the kernel's pci_dev.
 *
 * Every other register - the PCIe capability with DevCap/DevCtl/LnkCap/LnkCtl/LnkSta, MSI-X,
 * the extended capabilities - and every write go to QEMU's device untouched. The driver bound
 * at enumeration (e1000e) stays bound and keeps the device working; its MSI-X vectors are the
 * "GPU's" interrupts. Unloading the module puts everything back.
 *
 * Loaded after e1000e has bound (tests/e2e/vm/guest/gputuned-vm-gpu-up.service, before
 * gputuned.service): loaded earlier, e1000e would not match the device. bdf= names the function.
 */
#include <linux/module.h>
#include <linux/pci.h>

static char *bdf = "0000:04:00.0";
module_param(bdf, charp, 0444);
MODULE_PARM_DESC(bdf, "function to present as a GPU (domain:bus:device.function)");
static ushort vendor = 0x10de;
module_param(vendor, ushort, 0444);
MODULE_PARM_DESC(vendor, "vendor ID it reads as (default NVIDIA)");
static ushort device = 0x2335;
module_param(device, ushort, 0444);
MODULE_PARM_DESC(device, "device ID it reads as (default 0x2335, H200)");
static uint class_code = 0x030200;
module_param(class_code, uint, 0444);
MODULE_PARM_DESC(class_code, "class code it reads as (default 3D controller)");

static struct pci_dev *shim_dev;
static struct pci_bus *shim_bus;
static struct pci_ops *orig_ops;
static unsigned int shim_devfn;
static unsigned short orig_vendor, orig_device;
static unsigned int orig_class;

static int shim_read(struct pci_bus *bus, unsigned int devfn, int where, int size, u32 *val)
{
	int base = where & ~3, shift = (where & 3) * 8;
	u32 dword;
	int ret;

	if (devfn != shim_devfn || (base != PCI_VENDOR_ID && base != PCI_CLASS_REVISION))
		return orig_ops->read(bus, devfn, where, size, val);
	ret = orig_ops->read(bus, devfn, base, 4, &dword);
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
	return orig_ops->write(bus, devfn, where, size, val);
}

static struct pci_ops shim_ops = {
	.read = shim_read,
	.write = shim_write,
};

static int __init shim_init(void)
{
	unsigned int dom, busnr, dev, fn;
	struct pci_dev *pdev;

	if (sscanf(bdf, "%x:%x:%x.%x", &dom, &busnr, &dev, &fn) != 4)
		return -EINVAL;
	pdev = pci_get_domain_bus_and_slot(dom, busnr, PCI_DEVFN(dev, fn));
	if (!pdev) {
		pr_err("gputuned_fakegpu: no PCI function %s\n", bdf);
		return -ENODEV;
	}
	shim_dev = pdev; /* the reference is kept until unload */
	shim_bus = pdev->bus;
	shim_devfn = pdev->devfn;
	orig_vendor = pdev->vendor;
	orig_device = pdev->device;
	orig_class = pdev->class;
	orig_ops = pci_bus_set_ops(shim_bus, &shim_ops);
	pdev->vendor = vendor;
	pdev->device = device;
	pdev->class = class_code;
	pr_info("gputuned_fakegpu: %s (%04x:%04x class %06x) reads as %04x:%04x class %06x\n",
		bdf, orig_vendor, orig_device, orig_class, vendor, device, class_code);
	return 0;
}

static void __exit shim_exit(void)
{
	shim_dev->vendor = orig_vendor;
	shim_dev->device = orig_device;
	shim_dev->class = orig_class;
	pci_bus_set_ops(shim_bus, orig_ops);
	pci_dev_put(shim_dev);
}

module_init(shim_init);
module_exit(shim_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gputuned e2e: one PCI function reads as a GPU in config space");
