"""A host module named "custom" with a string type, in Python: what IREE's
custom-module samples implement in C++ (string.create, .length, .print,
.from_tensor, error), printing the lines the samples document."""

from hal_cpu.buffers import format_buffer_view
from hal_cpu.programs import HOST_MODULE_ABI_VERSION, HostModule, export


class CustomString:
    """The module's reference type ``!custom.string``."""

    def __init__(self, value: str):
        self.value = value


class CustomModule(HostModule):
    name = "custom"
    types = {"custom.string": CustomString}

    def __init__(self, prefix: str = "", debug: bool = False):
        super().__init__()
        self.prefix = prefix
        if debug:               # a debug build provides the optional import
            self.functions["string.dprint"] = self.string_print

    @export("string.create")
    def string_create(self, data: bytes) -> CustomString:
        s = CustomString(self.prefix + data.decode())
        print(f"CREATE {s.value}", flush=True)
        return s

    @export("string.from_tensor")
    def string_from_tensor(self, tensor) -> CustomString:
        s = CustomString(self.prefix + format_buffer_view(tensor, 128))
        print(f"CREATE {s.value}", flush=True)
        return s

    @export("string.length")
    def string_length(self, s: CustomString) -> int:
        print(f"LENGTH {s.value} = {len(s.value)}", flush=True)
        return len(s.value)

    @export("string.print")
    def string_print(self, s: CustomString) -> None:
        if s is not None:
            print(f"PRINT {s.value}", flush=True)

    @export("error")
    def error(self) -> None:
        raise RuntimeError("UNKNOWN; Forced failure")


def create_module(max_version: int, params: dict) -> CustomModule:
    """The default creation function."""
    return create_custom_module(max_version, params)


def create_custom_module(max_version: int, params: dict) -> CustomModule:
    """Creation function for ``--module=custom_string.py@create_custom_module
    ?prefix=...&debug=1``; refuses any other interface version."""
    if max_version != HOST_MODULE_ABI_VERSION:
        raise RuntimeError(f"unsupported runtime version {max_version}, module "
                           f"compiled with version {HOST_MODULE_ABI_VERSION}")
    return CustomModule(params.get("prefix", ""), params.get("debug") == "1")


def create_v0_module(max_version: int, params: dict) -> CustomModule:
    """A creation function built for interface version 0: refuses this runtime."""
    if max_version != 0:
        raise RuntimeError(f"unsupported runtime version {max_version}, module "
                           "compiled with version 0")
    return CustomModule()
