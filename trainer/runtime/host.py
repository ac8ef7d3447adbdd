"""What the host machine has to give."""


def available_memory_bytes():
    """The memory the kernel could give this process now (Linux MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
