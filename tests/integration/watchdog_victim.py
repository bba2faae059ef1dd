"""A stand-in serving process for the watchdog tests: records when SIGTERM arrives, then exits or ignores it.

Usage: watchdog_victim.py RECORD {obey,ignore} [ALLOCATE_MIB_UNTIL_KIB]
With an allocation target it also allocates (and touches) 64 MiB at a time until MemAvailable is below the
target, recording the moment it saw the crossing: real memory pressure for the benchmark.
"""

import signal
import sys
import time


def mem_available_kib():
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def main():
    record, mode = sys.argv[1], sys.argv[2]
    below_kib = int(sys.argv[3]) if len(sys.argv) > 3 else 0

    def on_term(_signum, _frame):
        with open(record, "a", encoding="ascii") as handle:
            handle.write(f"term {time.time():.6f}\n")
        if mode == "obey":
            sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    with open(record, "a", encoding="ascii") as handle:
        handle.write(f"ready {time.time():.6f}\n")
    hoard = []
    crossed = False
    while True:
        if below_kib and not crossed:
            if mem_available_kib() < below_kib:
                crossed = True
                with open(record, "a", encoding="ascii") as handle:
                    handle.write(f"crossed {time.time():.6f}\n")
            else:
                hoard.append(bytearray(64 * 2 ** 20))  # zero-filled: every page is touched
                continue
        time.sleep(0.01)


if __name__ == "__main__":
    main()
