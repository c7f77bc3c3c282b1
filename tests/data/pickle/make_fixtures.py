# Regenerates the CPython pickle fixtures read by tests/test_pickle.cpp:
#   python3 make_fixtures.py   (any Python 3.8+; no torch needed)
import pickle

def fixture(with_bytes):
    shared = ["frame", 7]
    obj = {
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31 - 1, 2**31, -2**31 - 1,
                 2**63 - 1, -2**63, 2**64 - 1, 2**40],
        "floats": [0.5, -1e300, 3.25],
        "nested": {"t": (1, (2, (3,))), "e": (), "l": [[], {}], "none": None, "b": [True, False]},
        "unicode": "h\u00e9llo \u2603",
        "shared": [shared, shared],
        "long_list": list(range(2500)),
        "repeated": ["address"] * 3,
        1: "int key",
        (1, 2): "tuple key",
    }
    if with_bytes:
        obj["bytes"] = b"\x00\x01\xff"
    return obj

with open("cpython_protocol2.pickle", "wb") as f:
    pickle.dump(fixture(False), f, protocol=2)
with open("cpython_protocol4.pickle", "wb") as f:
    pickle.dump(fixture(True), f, protocol=4)
