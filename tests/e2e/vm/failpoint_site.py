"""``sitecustomize`` for the guest's daemon in the QEMU lane's kill step (tests/e2e/test_vm.py).

On the one start whose environment has ``PYTHONPATH`` pointing here, Python imports this at
start-up: every kernel the shipped ``gputuned`` opens then takes the crash point named in
``GPUTUNED_FAILPOINT`` (tests/failpoint.py). The restart after the kill runs without either.
"""

from tests.failpoint import install_from_env

install_from_env()
