"""A RecorderClient works wherever it was created (issue 20): at module level of a program, before any event
loop exists, then inside `asyncio.run(main())` several times, and in two loops of two threads at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent


def test_a_client_made_before_any_loop_serves_several_asyncio_runs(recorder: RecorderProcess) -> None:
    client = RecorderClient(recorder.endpoint)  # no loop exists here: channels are made where they are used

    async def record_then_read(conversation: str) -> list[str]:
        await echo_agent(recorder.endpoint, calls=1).run("go", conversation_id=conversation)
        return [run.run_id for run in await client.list_runs(conversation_id=conversation)]

    first = asyncio.run(record_then_read("conv-loop-1"))
    second = asyncio.run(record_then_read("conv-loop-2"))  # a new loop: the first one's channel is let go
    assert len(first) == len(second) == 1

    async def read_and_close() -> int:
        history = await continue_run(client, run_id=first[0])
        await client.close()
        return len(history)

    assert asyncio.run(read_and_close()) > 0


def test_one_client_serves_two_loops_in_two_threads_at_once(recorder: RecorderProcess) -> None:
    """Each thread closes the client when it is done; one closing must not cancel the other's calls (it did)."""
    asyncio.run(echo_agent(recorder.endpoint, calls=1).run("go", conversation_id="conv-threads"))
    client = RecorderClient(recorder.endpoint)
    found: list[int] = []
    both_reading, first_closed = threading.Barrier(2), threading.Event()

    async def reads(count: int) -> None:
        for _ in range(count):
            found.append(len(await client.list_runs(conversation_id="conv-threads")))

    async def read_then_close() -> None:
        await reads(10)
        both_reading.wait()
        await client.close()
        first_closed.set()

    async def read_across_the_others_close() -> None:
        reading = asyncio.create_task(reads(40))  # its calls are in flight when the other thread closes
        await asyncio.to_thread(both_reading.wait)
        await asyncio.to_thread(first_closed.wait, 10)
        await reading
        await client.close()

    threads = [
        threading.Thread(target=asyncio.run, args=(read(),)) for read in (read_then_close, read_across_the_others_close)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert first_closed.is_set() and found == [1] * 50


def test_a_client_made_at_module_level_of_a_program_works_in_its_asyncio_run(recorder: RecorderProcess) -> None:
    """The reference's examples make their store at module level; a program doing that with a RecorderClient
    failed with "attached to a different loop"."""
    program = textwrap.dedent(f"""
        import asyncio
        from steprec.query import RecorderClient

        client = RecorderClient({recorder.endpoint!r})

        async def main():
            print(len(await client.list_runs()))

        asyncio.run(main())
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0"] and "Traceback" not in done.stderr
