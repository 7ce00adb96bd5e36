"""Sizes on the command lines of the dataset generators: a number with an optional K/M/G
suffix (binary, like coorfs's own --cache-size), e.g. 110K, 1.5M."""
import argparse

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text):
    """An argparse type: the bytes that `text` means."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}": expected a number with a K/M/G suffix')
