"""The ticket's eventfd driven from selectors and asyncio."""
import asyncio
import selectors

import openinfer as oi
from conftest import LAYOUT_BYTES, expected, fill, layout, read_block


def test_ticket_fd_with_selectors(host):
    buf = bytearray(LAYOUT_BYTES)
    hs = oi.hash_blocks(range(4 * 16), 16)
    with host.engine("py/sel", layout(), buffer=buf) as e:
        for b in range(4):
            fill(buf, b, seed=3, block=b)
        tickets = [e.save([b], [hs[b]]) for b in range(4)]
        sel = selectors.DefaultSelector()
        for t in tickets:
            sel.register(t, selectors.EVENT_READ, t)  # Ticket has fileno()
        pending = set(tickets)
        while pending:
            for key, _ in sel.select(timeout=10):
                t = key.data
                assert t.poll() is True
                sel.unregister(t)
                pending.discard(t)
        sel.close()
        # the fd stays readable after completion
        s2 = selectors.DefaultSelector()
        s2.register(tickets[0].fd, selectors.EVENT_READ)
        assert s2.select(timeout=0)
        s2.close()
        for t in tickets:
            t.close()


def test_ticket_with_asyncio(host):
    buf = bytearray(LAYOUT_BYTES)
    hs = oi.hash_blocks(range(4 * 16), 16)

    async def main(e):
        for b in range(4):
            fill(buf, b, seed=5, block=b)
        await asyncio.gather(*(e.save([b], [hs[b]]) for b in range(4)))
        buf[:] = bytes(LAYOUT_BYTES)
        q = e.query(hs)
        assert q.hit_blocks == 4
        t = e.load(q.lease, [12, 13, 14, 15])
        await t.wait_async()
        await t  # awaiting a finished ticket returns at once
        return [read_block(buf, 12 + b) for b in range(4)]

    with host.engine("py/asyncio", layout(), buffer=buf) as e:
        got = asyncio.run(main(e))
    assert got == [expected(5, b) for b in range(4)]
