"""Stand-in for an inference server in the e2e guest: a main thread and 3 workers, all sleeping.

Started by gputuned-vm-workload.service; the profile's [[process]] rule matches its command line.
"""

import threading
import time


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


for i in range(3):
    threading.Thread(target=sleep_forever, name=f"worker-{i}", daemon=True).start()
sleep_forever()
