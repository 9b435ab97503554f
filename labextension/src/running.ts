// A cell that kept running while its notebook's tab was closed (or reloaded): the reopened
// notebook shows its outputs so far and the ones that follow, with `[*]` until it ends, then its
// execution count. JupyterLab routes a kernel's IOPub messages only to the futures of the
// requests it sent, so a cell sent by a tab gone shows nothing by itself: the kernel keeps what
// the running cell published, and tells it on the `llfabric.running` comm
// (fabric/attach/frontend.py); its live outputs carry their `llfabric_seq` in their metadata.
// The same comm gives the cells that ended after the notebook's file was saved, which a reloaded
// notebook lacks (or shows as they were before): they come back as they ran, unsaved.
import { Notification } from '@jupyterlab/apputils';
import { ICodeCellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { createSubshell, deleteSubshell, sendOnSubshell } from './subshell';

export const RUNNING_TARGET = 'llfabric.running';
const OUTPUT_TYPES = new Set([
  'stream',
  'display_data',
  'execute_result',
  'error',
  'clear_output',
  'update_display_data'
]);

interface IOutputMessage {
  seq: number;
  msg_type: string;
  content: any;
}

// The running cell; `after`: the cell that ended before it started.
interface IRunning {
  cell_id: string | null;
  msg_id: string | null;
  execution_count: number;
  source: string;
  after: string | null;
  next: number;
  dropped: boolean;
  outputs: IOutputMessage[];
}

// A cell that ended after the notebook was saved.
type IEnded = Omit<IRunning, 'msg_id' | 'next'>;

interface IDone {
  msg_id: string | null;
  execution_count: number;
  status: string;
}

// Asks `kernel` whether a cell of it runs, and follows that cell in `panel`'s notebook. The
// kernel's main shell waits for the running cell, so the question goes on a subshell (JEP 91)
// of its own, asked for on the control channel: the kernel_info that tells JupyterLab whether
// the kernel has subshells waits for the cell too.
export class RunningCellFollower {
  constructor(
    private panel: NotebookPanel,
    private kernel: Kernel.IKernelConnection
  ) {
    kernel.iopubMessage.connect(this._onIOPub, this);
    void this._ask();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.kernel.iopubMessage.disconnect(this._onIOPub, this);
    if (this._comm !== null && !this._comm.isDisposed) {
      this._comm.dispose();
    }
    this._comm = null;
    this._buffered = [];
  }

  private async _ask(): Promise<void> {
    await this.panel.context.ready;
    const kernel = this.kernel;
    const subshell = await createSubshell(kernel);
    if (this._disposed || kernel.isDisposed) {
      deleteSubshell(kernel, subshell);
      return;
    }
    const comm = kernel.createComm(RUNNING_TARGET);
    this._comm = comm;
    comm.onMsg = msg => this._onCommMessage(msg.content.data as any, subshell);
    comm.onClose = () => {
      this._deleteSubshell(subshell);
      this.dispose(); // a kernel that is not attached has no such comm
    };
    const saved = this.panel.context.contentsModel?.last_modified;
    void sendOnSubshell(kernel, comm, subshell, 'comm_open', saved ? { saved } : {});
  }

  private _deleteSubshell(subshell: string | null): void {
    if (!this._subshellDeleted) {
      this._subshellDeleted = true;
      deleteSubshell(this.kernel, subshell);
    }
  }

  private _onCommMessage(
    data: { running?: IRunning | null; unsaved?: IEnded[]; done?: IDone },
    subshell: string | null
  ): void {
    const inserted: number[] = []; // prompts of the cells the notebook lacked
    if (data.unsaved) {
      this._restore(data.unsaved, inserted);
    }
    if (data.running !== undefined) {
      if (this._start(data.running, inserted)) {
        this._deleteSubshell(subshell); // the rest comes on IOPub
      } else {
        this._close(subshell);
      }
    } else if (data.done && data.done.msg_id === this._msgId) {
      this._finish(data.done.execution_count);
    }
    if (inserted.length > 0) {
      const one = inserted.length === 1;
      Notification.info(
        `llfabric: cell${one ? '' : 's'} ${inserted.map(n => `[${n}]`).join(', ')}, run ` +
          `since the notebook was last saved, ${one ? 'was' : 'were'} not in its file: ` +
          `back with ${one ? 'its' : 'their'} outputs (save to keep ${one ? 'it' : 'them'})`,
        { autoClose: 10000 }
      );
    }
  }

  // Follows the running cell (put back where the notebook lacks it); false where there is none
  // to follow.
  private _start(running: IRunning | null, inserted: number[]): boolean {
    let model = running ? this._cell(running.cell_id) : null;
    if (running !== null && model === null) {
      model = this._insert(running, running.execution_count, inserted);
    }
    // a cell this JupyterLab runs itself (another view of the notebook) shows its outputs already
    if (running === null || model === null || model.executionState === 'running') {
      return false;
    }
    this._model = model;
    this._msgId = running.msg_id;
    this._next = running.next;
    this._writer = show(model, running);
    model.executionState = 'running';
    const buffered = this._buffered;
    this._buffered = [];
    for (const msg of buffered) {
      this._onIOPub(this.kernel, msg);
    }
    return true;
  }

  // Closes the comm on `subshell` (null: the main shell), where the kernel has it, and deletes
  // that subshell once the close is handled: deleted first, the close would find no subshell.
  private _close(subshell: string | null): void {
    const comm = this._comm;
    if (comm !== null && !comm.isDisposed && !this.kernel.isDisposed) {
      void sendOnSubshell(this.kernel, comm, subshell, 'comm_close').then(() =>
        this._deleteSubshell(subshell)
      );
    } else {
      this._deleteSubshell(subshell);
    }
    this.dispose();
  }

  // The cells that ended since the notebook's file was saved, as they ran (source, outputs,
  // count).
  private _restore(unsaved: IEnded[], inserted: number[]): void {
    for (const ended of unsaved) {
      let model = this._cell(ended.cell_id);
      if (model?.executionCount === ended.execution_count) {
        continue; // shown already (another view of the notebook)
      }
      if (model === null) {
        model = this._insert(ended, ended.execution_count, inserted);
      } else if (model.sharedModel.getSource() !== ended.source) {
        model.sharedModel.setSource(ended.source);
      }
      if (model !== null) {
        show(model, ended);
        model.executionCount = ended.execution_count;
      }
    }
  }

  // A code cell for `cell`, which the notebook lacks, after the cell that ended before it (else
  // last); null where its id is a cell's of another type now.
  private _insert(
    cell: { cell_id: string | null; source: string; after: string | null },
    count: number,
    inserted: number[]
  ): ICodeCellModel | null {
    const notebook = this.panel.content.model;
    if (!notebook || !cell.cell_id || this._index(cell.cell_id) !== null) {
      return null;
    }
    const after = this._index(cell.after);
    notebook.sharedModel.insertCell(after === null ? notebook.cells.length : after + 1, {
      cell_type: 'code',
      id: cell.cell_id,
      source: cell.source,
      metadata: {}
    });
    inserted.push(count);
    return this._cell(cell.cell_id);
  }

  private _index(id: string | null): number | null {
    const cells = this.panel.content.model?.cells;
    for (let i = 0; id && cells && i < cells.length; i++) {
      if (cells.get(i).id === id) {
        return i;
      }
    }
    return null;
  }

  private _cell(id: string | null): ICodeCellModel | null {
    const cells = this.panel.content.model?.cells;
    if (!id || !cells) {
      return null;
    }
    for (let i = 0; i < cells.length; i++) {
      const cell = cells.get(i);
      if (cell.id === id && cell.type === 'code') {
        return cell as ICodeCellModel;
      }
    }
    return null;
  }

  private _onIOPub(_: unknown, msg: KernelMessage.IIOPubMessage): void {
    if (this._disposed) {
      return;
    }
    if (this._model === null) {
      this._buffered.push(msg); // before the kernel said which cell runs
      return;
    }
    const parent = (msg.parent_header as KernelMessage.IHeader | undefined)?.msg_id;
    if (parent !== this._msgId) {
      return;
    }
    if (msg.header.msg_type === 'status') {
      if ((msg.content as any).execution_state === 'idle') {
        this._finish(null); // its end, where the comm's word of it went missing
      }
      return;
    }
    const seq = (msg.metadata as any)?.llfabric_seq;
    if (typeof seq !== 'number' || seq < this._next) {
      return; // not the cell's own, or shown already
    }
    this._next = seq + 1;
    this._writer?.write(msg.header.msg_type, msg.content);
  }

  private _finish(count: number | null): void {
    const model = this._model;
    if (model !== null) {
      if (count !== null) {
        model.executionCount = count;
      }
      model.executionState = 'idle';
    }
    this._close(null); // its subshell is gone; the main shell is free again
  }

  private _disposed = false;
  private _subshellDeleted = false;
  private _comm: Kernel.IComm | null = null;
  private _model: ICodeCellModel | null = null;
  private _writer: OutputWriter | null = null;
  private _msgId: string | null = null;
  private _next = 0;
  private _buffered: KernelMessage.IIOPubMessage[] = [];
}

// Shows in `model` what a cell published (`cell.outputs`), in place of what it showed; the
// writer for what it publishes next.
function show(
  model: ICodeCellModel,
  cell: { dropped: boolean; outputs: IOutputMessage[] }
): OutputWriter {
  model.outputs.clear();
  if (cell.dropped) {
    model.outputs.add({
      output_type: 'stream',
      name: 'stderr',
      text: 'llfabric: earlier outputs of this cell were dropped (they were too long)\n'
    });
  }
  const writer = new OutputWriter(model.outputs);
  for (const output of cell.outputs) {
    writer.write(output.msg_type, output.content);
  }
  return writer;
}

// A cell's IOPub output messages into its outputs, as JupyterLab's output area takes them: a
// clear_output at once or at the next output, a display's updates in place.
class OutputWriter {
  constructor(private outputs: ICodeCellModel['outputs']) {}

  write(msgType: string, content: any): void {
    const outputs = this.outputs;
    if (!OUTPUT_TYPES.has(msgType)) {
      return;
    }
    const displayId: string | undefined = content.transient?.display_id;
    if (msgType === 'clear_output') {
      outputs.clear(!!content.wait);
      this._clearNext = !!content.wait; // the model clears at the next output
      if (!content.wait) {
        this._displays.clear();
      }
    } else if (msgType === 'update_display_data') {
      for (const index of this._displays.get(displayId ?? '') ?? []) {
        if (index < outputs.length) {
          outputs.set(index, { ...content, output_type: 'display_data' });
        }
      }
    } else {
      if (this._clearNext) {
        this._displays.clear();
        this._clearNext = false;
      }
      outputs.add({ ...content, output_type: msgType });
      if (displayId && msgType !== 'stream') {
        const indices = this._displays.get(displayId) ?? [];
        indices.push(outputs.length - 1);
        this._displays.set(displayId, indices);
      }
    }
  }

  private _displays = new Map<string, number[]>(); // display_id: its outputs' indices
  private _clearNext = false;
}
