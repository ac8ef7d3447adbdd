"""What the host machine has to give."""

import os
import platform


def available_memory_bytes():
    """The memory the kernel could give this process now (Linux MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def cpu_name():
    """The CPU's model name from /proc/cpuinfo (Linux), else the platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores():
    """The cores this process may run on (as TensorFlow's thread pools count them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
