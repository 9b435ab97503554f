// One notebook's comms with its attached kernel (fabric/attach/frontend.py): the status the
// kernel sends, the notices it sends, the drafts this side sends as the user types, and the
// session's versions, one of which this side may check out.
import { Notification } from '@jupyterlab/apputils';
import { ICellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { CommsOverSubshells, Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';
import { RunningCellFollower } from './running';
import { CellStarts, IStarted } from './starts';
import { createSubshell, deleteSubshell, sendOnSubshell } from './subshell';

export const DRAFT_TARGET = 'llfabric.draft';
export const STATUS_TARGET = 'llfabric.status';
export const HISTORY_TARGET = 'llfabric.history';
// The notebook's metadata key for its session (fabric/attach/notebook_file.py): the session
// belongs to the notebook, wherever it is moved, and a copy gets its own.
export const IDENTITY_KEY = 'llfabric';
// While the user types, a draft at most this often (the latest text each time), so that the
// worker is readied during the typing, not only after a pause in it.
const THROTTLE_MS = 300;
const NOTICE_MS = 8000; // a notification closes itself after this
// What a pinned session means and what the user can do, said once, within the 140 characters
// a notification shows; the status item's tooltip holds the details.
const PINNED =
  'llfabric: values that cannot be saved keep this session on its worker (pinned); del them ' +
  'to free it. Details: status bar';

export interface IStatus {
  session: string;
  address: string;
  open?: boolean;
  version?: number;
  tier?: string; // hot, warm, cool or cold
  kind?: string; // gpu or cpu
  lease?: string; // held, queued or released
  position?: number | null; // in the queue for a slot
  lease_seconds?: number; // 0: no cell has run yet
  saved_hours?: number;
  saved_share?: number;
  pinned?: boolean;
  error?: string;
}

// One version of the session, as the server's `versions` op describes it.
export interface IVersion {
  version: number;
  execution_count: number;
  first_line: string;
  lines: number;
  status: string;
  time: number; // seconds since the epoch
  checkout: number | null; // the version a checkout went back to
  tags: string[];
  size: number | null; // bytes; null: thinned by retention
  variables: number;
  unsaved: string[];
  added: string[];
  changed: string[];
  removed: string[];
  more: number; // names changed beyond those listed
}

export interface IHistory {
  session: string;
  version: number; // the head
  versions: IVersion[]; // newest first
  error?: string;
}

export class Link {
  constructor(private panel: NotebookPanel) {
    const context = panel.sessionContext;
    context.statusChanged.connect(this._onKernelStatus, this);
    context.kernelChanged.connect(() => {
      this._reset();
      this._followRunning();
    }, this);
    panel.content.activeCellChanged.connect(this._watchActiveCell, this);
    panel.context.pathChanged.connect(() => this._keepIdentity(), this);
    this._watchActiveCell();
    this._followRunning();
    panel.disposed.connect(() => {
      this._reset();
      this._follower?.dispose();
    });
  }

  get status(): IStatus | null {
    return this._status;
  }

  // How its cells started, beside their prompts where the setting shows them.
  readonly starts = new CellStarts(this.panel);

  get changed(): ISignal<this, IStatus | null> {
    return this._changed;
  }

  // The latest word of each notice topic this session had, for the status item's tooltip.
  get notices(): ReadonlyMap<string, string> {
    return this._notices;
  }

  get history(): IHistory | null {
    return this._history;
  }

  get historyChanged(): ISignal<this, IHistory | null> {
    return this._historyChanged;
  }

  // As `%llfabric checkout VERSION`: the next cell runs on that version's state.
  checkout(version: number): void {
    if (this._historyComm === null) {
      Notification.error('llfabric: the kernel is not attached to a session');
      return;
    }
    this._historyComm.send({ op: 'checkout', version });
  }

  // A kernel that is idle again may have attached since (`%load_ext fabric.attach`); one that
  // restarts has lost its comms.
  private _onKernelStatus(_: unknown, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._reset();
    } else if (
      (status === 'idle' || status === 'busy') &&
      this._statusComm === null &&
      !this._refused
    ) {
      this._openStatus(); // busy: a notebook reopened while its cell runs
    }
  }

  // A kernel this notebook connects to may be running one of its cells, sent from a tab since
  // closed: once connected, ask, and show that cell's outputs as they come.
  private _followRunning(): void {
    const kernel = this._kernel();
    if (kernel === null || kernel === this._followed) {
      return;
    }
    this._followed = kernel;
    this._follower?.dispose();
    this._follower = null;
    const start = () => {
      if (this._followed === kernel && !kernel.isDisposed && !this.panel.isDisposed) {
        this._follower = new RunningCellFollower(this.panel, kernel);
      }
    };
    if (kernel.connectionStatus === 'connected') {
      start();
      return;
    }
    const onConnection = (_: unknown, status: Kernel.ConnectionStatus) => {
      if (status === 'connected') {
        kernel.connectionStatusChanged.disconnect(onConnection);
        start();
      }
    };
    kernel.connectionStatusChanged.connect(onConnection);
  }

  private _kernel(): Kernel.IKernelConnection | null {
    return this.panel.sessionContext.session?.kernel ?? null;
  }

  private _openStatus(): void {
    const kernel = this._kernel();
    if (kernel === null) {
      return;
    }
    const comm = kernel.createComm(STATUS_TARGET);
    comm.onMsg = msg => this._onStatusMessage(msg.content.data as any);
    comm.onClose = () => {
      // a kernel that is not attached closes the comm at once
      this._statusComm = null;
      this._refused = this._status === null;
      this._setStatus(null);
    };
    this._statusComm = comm;
    // opened on a subshell of its own, so that the status shows while a cell runs
    void createSubshell(kernel).then(async subshell => {
      if (!comm.isDisposed && this._statusComm === comm) {
        await sendOnSubshell(kernel, comm, subshell, 'comm_open');
      }
      deleteSubshell(kernel, subshell); // its messages come on IOPub
    });
  }

  private _onStatusMessage(data: {
    status?: IStatus;
    notice?: string;
    topic?: string;
    started?: IStarted;
  }): void {
    if (data.started) {
      this.starts.record(data.started);
    }
    if (data.status) {
      this._setStatus(data.status);
      this._keepIdentity();
      if (this._historyComm === null && data.status.session) {
        this._openHistory(); // the kernel is attached: its session has a history
      }
      if (data.status.pinned) {
        this._notify('pinned', 'warning', PINNED);
      }
    }
    if (data.notice) {
      const topic = data.topic || data.notice;
      this._notices.set(topic, data.notice);
      if (topic === 'pinned') {
        this._notify(topic, 'warning', PINNED);
      } else {
        this._notify(topic, 'info', `llfabric: ${data.notice}`);
      }
      this._changed.emit(this._status);
    }
  }

  // One notification per condition (a notice's topic) and session, ever: a later word of it
  // updates the one still shown, and none is shown again after a reload.
  private _notify(topic: string, type: 'info' | 'warning', message: string): void {
    const session = this._status?.session;
    if (!session) {
      return;
    }
    const key = `llfabric-notified:${session}:${topic}`;
    const shown = this._shown.get(key);
    if (shown !== undefined) {
      Notification.update({ id: shown, message, type, autoClose: NOTICE_MS });
      return;
    }
    if (window.localStorage.getItem(key) !== null) {
      return;
    }
    window.localStorage.setItem(key, String(Date.now()));
    this._shown.set(key, Notification.emit(message, type, { autoClose: NOTICE_MS }));
  }

  // The notebook's metadata names the session its kernel opened and where the notebook is:
  // a kernel started for it later opens that session (a copy, a new one).
  private _keepIdentity(): void {
    const session = this._status?.session;
    const model = this.panel.context.model;
    if (!session || this._status?.error || model === null) {
      return;
    }
    const identity = { session, path: this.panel.context.path };
    const saved = model.getMetadata(IDENTITY_KEY) as typeof identity | undefined;
    if (saved?.session !== identity.session || saved?.path !== identity.path) {
      model.setMetadata(IDENTITY_KEY, identity);
    }
  }

  private _openHistory(): void {
    const kernel = this._kernel();
    if (kernel === null) {
      return;
    }
    const comm = kernel.createComm(HISTORY_TARGET);
    comm.onMsg = msg => this._onHistoryMessage(msg.content.data as any);
    comm.onClose = () => {
      this._historyComm = null;
      this._setHistory(null);
    };
    comm.open({ op: 'list' });
    this._historyComm = comm;
  }

  private _onHistoryMessage(data: {
    versions?: IVersion[];
    checked_out?: number;
    version?: number;
    warning?: string;
    error?: string;
  }): void {
    if (data.versions) {
      this._setHistory(data as IHistory);
    } else if (data.checked_out !== undefined) {
      Notification.success(
        `llfabric: back at the state of version ${data.checked_out}; ` +
          'the next cell runs on it',
        { autoClose: 5000 }
      );
      if (data.warning) {
        Notification.warning(`llfabric: ${data.warning}`, { autoClose: 10000 });
      }
    } else if (data.error) {
      Notification.error(`llfabric: no checkout: ${data.error}`, { autoClose: 8000 });
    }
  }

  private _setHistory(history: IHistory | null): void {
    this._history = history;
    this._historyChanged.emit(history);
  }

  private _setStatus(status: IStatus | null): void {
    this._status = status;
    this._changed.emit(status);
  }

  private _watchActiveCell(): void {
    this._watched?.sharedModel.changed.disconnect(this._onEdit, this);
    const cell = this.panel.content.activeCell;
    this._watched = cell?.model.type === 'code' ? cell.model : null;
    this._watched?.sharedModel.changed.connect(this._onEdit, this);
  }

  // Its source typed, not its outputs, prompt or state changed (a cell run and stayed on)
  private _onEdit(_: unknown, change: { sourceChange?: unknown }): void {
    if (change.sourceChange && this._timer === null) {
      this._timer = setTimeout(() => this._sendDraft(), THROTTLE_MS);
    }
  }

  // The active cell's source, with a revision the kernel uses to drop older ones.
  private _sendDraft(): void {
    this._timer = null;
    const source = this._watched?.sharedModel.getSource();
    if (source === undefined || this._statusComm === null) {
      return; // no cell, or a kernel that is not attached
    }
    this._revision += 1;
    this._pendingDraft = { source, revision: this._revision };
    if (this._draftComm === null) {
      const kernel = this._kernel();
      if (kernel === null) {
        return;
      }
      const comm = kernel.createComm(DRAFT_TARGET);
      this._draftComm = comm;
      this._draftReady = false;
      comm.onClose = () => {
        if (this._draftComm === comm) {
          this._draftComm = null;
        }
      };
      // opened once its subshell exists, so that the open, too, arrives while a cell runs;
      // the newest draft typed meanwhile goes with it
      void onSubshell(kernel, comm).then(() => {
        if (comm.isDisposed || this._draftComm !== comm) {
          return;
        }
        this._draftReady = true;
        comm.open(this._pendingDraft ?? {});
        this._pendingDraft = null;
      });
    } else if (this._draftReady && this._pendingDraft !== null) {
      this._draftComm.send(this._pendingDraft);
      this._pendingDraft = null;
    }
  }

  private _reset(): void {
    for (const comm of [this._statusComm, this._draftComm, this._historyComm]) {
      if (comm !== null && !comm.isDisposed) {
        comm.dispose();
      }
    }
    this._statusComm = null;
    this._draftComm = null;
    this._historyComm = null;
    this._refused = false;
    this._notices.clear();
    this._setStatus(null);
    this._setHistory(null);
  }

  private _status: IStatus | null = null;
  private _notices = new Map<string, string>();
  private _shown = new Map<string, string>(); // notification ids, by session and topic
  private _followed: Kernel.IKernelConnection | null = null;
  private _follower: RunningCellFollower | null = null;
  private _changed = new Signal<this, IStatus | null>(this);
  private _statusComm: Kernel.IComm | null = null;
  private _draftComm: Kernel.IComm | null = null;
  private _draftReady = false; // opened: drafts go out as they are typed
  private _pendingDraft: { source: string; revision: number } | null = null;
  private _historyComm: Kernel.IComm | null = null;
  private _history: IHistory | null = null;
  private _historyChanged = new Signal<this, IHistory | null>(this);
  private _refused = false;
  private _revision = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _watched: ICellModel | null = null;
}

// Drafts go on a kernel subshell (JEP 91) where the kernel has them (its kernel_info's
// supported_features lists "kernel subshells"): a cell that runs holds the kernel's main shell
// (an attached kernel's main thread waits for the fabric), and a draft is worth most while the
// user types the next cell during it. JupyterLab sends comms on subshells by default; a setting
// that turned it off still leaves drafts on theirs. Resolves once the comm's subshell exists,
// at once where there is none.
async function onSubshell(
  kernel: Kernel.IKernelConnection,
  comm: Kernel.IComm
): Promise<void> {
  try {
    await kernel.info;
  } catch {
    return; // no kernel_info: the main shell
  }
  if (!kernel.supportsSubshells) {
    return;
  }
  if (comm.commsOverSubshells === CommsOverSubshells.Disabled) {
    comm.commsOverSubshells = CommsOverSubshells.PerCommTarget;
  }
  const started = (comm as { subshellStarted?: Promise<void> }).subshellStarted;
  try {
    await started;
  } catch {
    // no subshell after all: the main shell
  }
}
