"""The QEMU lane's machinery: guest image (image.py), QEMU runner (machine.py), guest agent
client (qga.py), the GPU stand-in module (fakegpu/) and the files put into the guest (guest/).
docs/dev/e2e-vm.md describes the lane; tests/e2e/test_vm.py is the scenario."""
