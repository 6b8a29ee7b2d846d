#!/usr/bin/env python3
"""A TCP forwarder that delays every byte by a fixed time in each direction: link latency for
scripts/link_bench.sh where the kernel has no sch_netem. Order is kept; bandwidth is limited
elsewhere (tc tbf on the veth). usage: delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS"""
import asyncio
import sys


async def pump(reader, writer, delay):
    queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(1 << 16):
            queue.put_nowait((loop.time() + delay, data))
    except ConnectionError:
        pass
    queue.put_nowait((0, None))
    try:
        await sender
    except ConnectionError:
        pass


async def main():
    listen, target, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(thost, int(tport))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer, delay_ms / 1000),
                             pump(server_reader, client_writer, delay_ms / 1000))

    server = await asyncio.start_server(handle, lhost, int(lport))
    async with server:
        await server.serve_forever()


asyncio.run(main())
