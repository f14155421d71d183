#!/usr/bin/env python3
"""save -> query -> load with an embedded host on the cpu backend.

    PYTHONPATH=... python3 roundtrip.py
"""
import openinfer as oi

BLOCKS, BPB = 8, 4096  # blocks per arena, bytes per block


def main():
    kv = bytearray(2 * BLOCKS * BPB)  # the "device" KV buffer: arenas k and v
    arenas = [oi.Arena("k", BLOCKS, BPB, offset=0), oi.Arena("v", BLOCKS, BPB, offset=BLOCKS * BPB)]
    prompt = list(range(1000, 1000 + 3 * 16))
    hashes = oi.hash_blocks(prompt, 16)  # one 16-byte hash per full 16-token block

    with oi.OffloadHost(16 << 20) as host, \
            oi.OffloadEngine(host, "example/model", arenas, buffer=kv) as engine:
        for b in range(3):  # the KV of blocks 0..2 (k and v)
            kv[b * BPB:(b + 1) * BPB] = bytes([b + 1]) * BPB
            kv[(BLOCKS + b) * BPB:(BLOCKS + b + 1) * BPB] = bytes([b + 101]) * BPB
        engine.save([0, 1, 2], hashes).wait()          # device -> host tier
        original = bytes(kv)

        kv[:] = bytes(len(kv))                        # the GPU evicted them
        result = engine.query(hashes, req_id="req-1")  # leading run + a lease
        print("hit blocks:", result.hit_blocks)
        engine.load(result.lease, [0, 1, 2]).wait()    # host tier -> device
        assert bytes(kv) == original, "restored bytes differ"
        print("restored", result.hit_blocks, "blocks byte-exact;", host.stats()["blocks_sealed"],
              "blocks in the host tier")


if __name__ == "__main__":
    main()
