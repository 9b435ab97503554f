// Comms a notebook opens while its kernel's main shell may be running a cell (a notebook
// reopened then): on a kernel subshell (JEP 91) of their own, asked for on the control channel,
// since the kernel_info that tells JupyterLab whether the kernel has subshells waits for the
// cell too. A kernel without subshells gets them on its main shell, once the cell is over.
import { Kernel, KernelMessage } from '@jupyterlab/services';

const SUBSHELL_WAIT_MS = 5000; // for a kernel without subshells, that never answers

// A new subshell's id; null where the kernel has none.
export async function createSubshell(kernel: Kernel.IKernelConnection): Promise<string | null> {
  const request = KernelMessage.createMessage({
    msgType: 'create_subshell_request',
    channel: 'control',
    username: kernel.username,
    session: kernel.clientId,
    content: {}
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const future = kernel.sendControlMessage(request, true, true);
    const reply = (await Promise.race([
      future.done,
      new Promise<null>(resolve => {
        timer = setTimeout(() => resolve(null), SUBSHELL_WAIT_MS);
      })
    ])) as any;
    if (reply === null) {
      future.dispose();
      return null;
    }
    return reply.content.status === 'ok' ? reply.content.subshell_id : null;
  } catch {
    return null; // no subshells: the main shell, once the cell (if any) is over
  } finally {
    clearTimeout(timer);
  }
}

export function deleteSubshell(kernel: Kernel.IKernelConnection, subshell: string | null): void {
  if (subshell === null || kernel.isDisposed) {
    return;
  }
  try {
    const request = KernelMessage.createMessage({
      msgType: 'delete_subshell_request',
      channel: 'control',
      username: kernel.username,
      session: kernel.clientId,
      content: { subshell_id: subshell }
    });
    kernel.sendControlMessage(request, true, true);
  } catch {
    // a kernel gone takes its subshells with it
  }
}

// Sends `comm`'s comm_open (with `data`) or comm_close on `subshell` (null: the main shell);
// resolves once the kernel has handled it.
export async function sendOnSubshell(
  kernel: Kernel.IKernelConnection,
  comm: Kernel.IComm,
  subshell: string | null,
  msgType: 'comm_open' | 'comm_close',
  data: object = {}
): Promise<void> {
  const content =
    msgType === 'comm_open'
      ? { comm_id: comm.commId, target_name: comm.targetName, data }
      : { comm_id: comm.commId, data: {} };
  const message = KernelMessage.createMessage({
    msgType,
    channel: 'shell',
    username: kernel.username,
    session: kernel.clientId,
    subshellId: subshell,
    content
  } as any);
  try {
    await kernel.sendShellMessage(message as any, false, true).done;
  } catch {
    // a kernel gone, or restarted meanwhile
  }
}
