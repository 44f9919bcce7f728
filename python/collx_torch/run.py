"""torchrun (torch.distributed.run), mended for Debian's torch 1.13 on Python 3.11:

    /usr/bin/python3 -m collx_torch.run --standalone --nproc_per_node 2 train.py ...

Debian's `python3 -m torch.distributed.run` fails at start on Python 3.11, for every backend:
its Std.from_str looks the redirect value up by iterating the Std flag, and since 3.11 iterating
a Flag skips the 0-valued NONE and the multi-bit ALL, so the default "0" becomes None
("'NoneType' object has no attribute 'get'"; later torch releases look the value up directly).
This sets that one lookup right and runs torchrun's own main() with the same arguments."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api as _api


def _from_str(cls, vm):
    if re.match(_api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(_api._MAPPING_REGEX, vm):
        return {int(k): cls(int(v)) for k, v in (x.split(":") for x in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{_api._VALUE_REGEX}> or <{_api._MAPPING_REGEX}>")


_api.Std.from_str = classmethod(_from_str)


def main():
    from torch.distributed.run import main as torchrun_main
    torchrun_main(sys.argv[1:])


if __name__ == "__main__":
    main()
