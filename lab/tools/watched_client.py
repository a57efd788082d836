"""The notebook client the lab's runner executes lessons with: papermill's, less two ways to wait
for nothing.

A *stall* is a cell whose kernel has finished (it sent its outputs and went idle on IOPub) while the
client still waits on the shell channel for the cell's reply. The kernel sends that reply before it
goes idle, so a reply missing `stall_s` after the idle is never coming (nbclient #312 is one such
wait). The client fails the cell as stalled instead of waiting for the cell's timeout. A *slow* cell
is still busy: it may run up to the timeout.

A cell that runs past its timeout is an error, never a completed cell (nbclient would otherwise
interrupt the kernel and carry on when configured to).
"""

from __future__ import annotations

import asyncio

from nbclient.exceptions import CellTimeoutError
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines

ENGINE_NAME = "lab-watched"
# the kernel is idle and no reply has come: far longer than any reply takes to arrive after idle
STALL_S = 60.0


class CellStalledError(CellTimeoutError):
    """The kernel went idle after the cell, and its reply never reached the client."""


class WatchedNotebookClient(PapermillNotebookClient):
    stall_s: float = STALL_S

    async def _async_poll_for_reply(
        self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive
    ):
        reply = asyncio.ensure_future(
            super()._async_poll_for_reply(
                msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive
            )
        )
        try:
            await asyncio.wait({reply, task_poll_output_msg}, return_when=asyncio.FIRST_COMPLETED)
            if not reply.done():  # the kernel is idle: its reply was sent already
                await asyncio.wait({reply}, timeout=self.stall_s)
            if not reply.done():
                raise CellStalledError(
                    f"stalled: the kernel went idle and no reply came in {self.stall_s:.0f} s, "
                    f"in the cell `{first_line(cell)}`"
                )
            return reply.result()
        finally:
            reply.cancel()

    async def _async_handle_timeout(self, timeout, cell=None):
        raise CellTimeoutError(
            f"timed out: the cell `{first_line(cell)}` was still running after {timeout} s"
        )


def first_line(cell) -> str:
    lines = [line for line in (cell.source if cell else "").splitlines() if line.strip()]
    return lines[0][:100] if lines else "(empty)"


class WatchedEngine(NBClientEngine):
    """papermill's nbclient engine with the watched client (papermill's `engine_name=ENGINE_NAME`)."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, stall_s: float = STALL_S, **kwargs):
        """papermill's call (`nb_man`, `kernel_name`, keywords), its timeouts renamed to
        nbclient's."""
        kwargs.pop("input_path", None)
        client = WatchedNotebookClient(
            nb_man,
            timeout=kwargs.pop("execution_timeout", None),
            startup_timeout=kwargs.pop("start_timeout", 60),
            kernel_name=kernel_name,
            **kwargs,
        )
        client.stall_s = stall_s
        return client.execute()


papermill_engines.register(ENGINE_NAME, WatchedEngine)
