"""BLAKE3 in pure Python, for machines where the `tessera` binary is absent.

The farm addresses every file by its BLAKE3 digest (hex). Blender's Python has
no blake3 module, so the add-on asks `tessera hash` when it can find the
binary (hundreds of MB/s), and falls back to this module otherwise. It follows
the reference implementation (https://github.com/BLAKE3-team/BLAKE3, the
`reference_impl`), with the compression function unrolled into straight-line
code generated at import: CPython then hashes a few MB/s, enough for a scene
and a handful of textures; `speed()` measures it on this machine.
"""

import struct
import time

IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
      0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
MSG_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
CHUNK_START = 1
CHUNK_END = 2
PARENT = 4
ROOT = 8
CHUNK_LEN = 1024
BLOCK_LEN = 64

_UNPACK = struct.Struct("<16I").unpack
_PACK8 = struct.Struct("<8I").pack


def _generate_compress():
    """Source of `compress(cv, m, counter, block_len, flags) -> 16 words`: seven
    rounds of G with the message permutation resolved at generation time."""
    lines = ["def compress(cv, m, counter, block_len, flags):",
             "    s0, s1, s2, s3, s4, s5, s6, s7 = cv",
             "    s8, s9, s10, s11 = %d, %d, %d, %d" % IV[:4],
             "    s12 = counter & 0xFFFFFFFF",
             "    s13 = (counter >> 32) & 0xFFFFFFFF",
             "    s14 = block_len",
             "    s15 = flags",
             "    m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = m"]
    order = list(range(16))

    def g(a, b, c, d, x, y):
        a, b, c, d = "s%d" % a, "s%d" % b, "s%d" % c, "s%d" % d
        return [
            "    %s = (%s + %s + m%d) & 0xFFFFFFFF" % (a, a, b, x),
            "    %s ^= %s; %s = ((%s >> 16) | (%s << 16)) & 0xFFFFFFFF" % (d, a, d, d, d),
            "    %s = (%s + %s) & 0xFFFFFFFF" % (c, c, d),
            "    %s ^= %s; %s = ((%s >> 12) | (%s << 20)) & 0xFFFFFFFF" % (b, c, b, b, b),
            "    %s = (%s + %s + m%d) & 0xFFFFFFFF" % (a, a, b, y),
            "    %s ^= %s; %s = ((%s >> 8) | (%s << 24)) & 0xFFFFFFFF" % (d, a, d, d, d),
            "    %s = (%s + %s) & 0xFFFFFFFF" % (c, c, d),
            "    %s ^= %s; %s = ((%s >> 7) | (%s << 25)) & 0xFFFFFFFF" % (b, c, b, b, b),
        ]

    for _ in range(7):
        o = order
        lines += g(0, 4, 8, 12, o[0], o[1])
        lines += g(1, 5, 9, 13, o[2], o[3])
        lines += g(2, 6, 10, 14, o[4], o[5])
        lines += g(3, 7, 11, 15, o[6], o[7])
        lines += g(0, 5, 10, 15, o[8], o[9])
        lines += g(1, 6, 11, 12, o[10], o[11])
        lines += g(2, 7, 8, 13, o[12], o[13])
        lines += g(3, 4, 9, 14, o[14], o[15])
        order = [o[MSG_PERMUTATION[i]] for i in range(16)]
    lines.append("    return (s0 ^ s8, s1 ^ s9, s2 ^ s10, s3 ^ s11, s4 ^ s12, s5 ^ s13, "
                 "s6 ^ s14, s7 ^ s15, s8 ^ cv[0], s9 ^ cv[1], s10 ^ cv[2], s11 ^ cv[3], "
                 "s12 ^ cv[4], s13 ^ cv[5], s14 ^ cv[6], s15 ^ cv[7])")
    return "\n".join(lines) + "\n"


_namespace = {}
exec(compile(_generate_compress(), "<blake3 compress>", "exec"), _namespace)  # noqa: S102
compress = _namespace["compress"]


def _chunk_cv(chunk, counter):
    """Chaining value of a full, non-final 1024-byte chunk."""
    cv = IV
    for i in range(0, CHUNK_LEN, BLOCK_LEN):
        flags = (CHUNK_START if i == 0 else 0) | (CHUNK_END if i == CHUNK_LEN - BLOCK_LEN else 0)
        cv = compress(cv, _UNPACK(chunk[i:i + BLOCK_LEN]), counter, BLOCK_LEN, flags)[:8]
    return cv


class Hasher:
    """Incremental BLAKE3 (unkeyed, 32-byte output)."""

    def __init__(self):
        self._stack = []       # chaining values of complete subtrees
        self._chunks = 0       # full chunks added to the tree
        self._buf = b""        # bytes of the chunk in progress (at most 1024)

    def update(self, data):
        buf = self._buf + bytes(data) if self._buf else bytes(data)
        # Keep the last chunk back (even when full): it may be the root.
        n = len(buf)
        pos = 0
        while n - pos > CHUNK_LEN:
            self._add_cv(_chunk_cv(buf[pos:pos + CHUNK_LEN], self._chunks))
            pos += CHUNK_LEN
        self._buf = buf[pos:]
        return self

    def _add_cv(self, cv):
        self._chunks += 1
        total = self._chunks
        while total & 1 == 0:
            cv = compress(IV, self._stack.pop() + cv, 0, BLOCK_LEN, PARENT)[:8]
            total >>= 1
        self._stack.append(cv)

    def digest(self):
        buf = self._buf
        # The last chunk: every block but the last compressed, the last kept as the output.
        cv = IV
        nblocks = max(1, (len(buf) + BLOCK_LEN - 1) // BLOCK_LEN)
        for i in range(nblocks - 1):
            flags = CHUNK_START if i == 0 else 0
            cv = compress(cv, _UNPACK(buf[i * BLOCK_LEN:(i + 1) * BLOCK_LEN]),
                          self._chunks, BLOCK_LEN, flags)[:8]
        last = buf[(nblocks - 1) * BLOCK_LEN:]
        out_cv, out_block, out_counter, out_len = cv, last, self._chunks, len(last)
        out_flags = (CHUNK_START if nblocks == 1 else 0) | CHUNK_END
        words = _UNPACK(out_block.ljust(BLOCK_LEN, b"\0"))
        for left in reversed(self._stack):
            right = compress(out_cv, words, out_counter, out_len, out_flags)[:8]
            out_cv, words, out_counter, out_len, out_flags = IV, left + right, 0, BLOCK_LEN, PARENT
        root = compress(out_cv, words, out_counter, out_len, out_flags | ROOT)[:8]
        return _PACK8(*root)

    def hexdigest(self):
        return self.digest().hex()


def hash_bytes(data):
    """Hex BLAKE3 of `data`."""
    return Hasher().update(data).hexdigest()


def hash_file(path, progress=None, cancelled=None):
    """Hex BLAKE3 and size of the file at `path`; calls `progress(nbytes)` as it
    reads and stops with InterruptedError when `cancelled()` turns true."""
    h = Hasher()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 16)
            if not block:
                break
            h.update(block)
            size += len(block)
            if progress:
                progress(len(block))
            if cancelled and cancelled():
                raise InterruptedError("cancelled")
    return h.hexdigest(), size


def speed(seconds=0.2):
    """Bytes per second this module hashes on this machine (a short measurement)."""
    data = bytes(range(256)) * 256  # 64 KiB
    h = Hasher()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        h.update(data)
        n += len(data)
    return n / max(time.perf_counter() - t0, 1e-9)
