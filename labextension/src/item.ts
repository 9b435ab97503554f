// The status bar item: the current notebook's session on the fabric, in one line.
import { Widget } from '@lumino/widgets';
import { IStatus } from './link';

export class StatusItem extends Widget {
  constructor() {
    super();
    this.addClass('jp-StatusBar-TextItem');
    this.node.dataset.llfabric = 'status';
  }

  // `notices`: the latest word of each condition llfabric told of, in the tooltip.
  show_(status: IStatus | null, notices: ReadonlyMap<string, string> = new Map()): void {
    this.node.textContent = status === null ? '' : describe(status);
    this.node.title =
      status === null
        ? ''
        : [
            `llfabric server ${status.address}, version ${status.version ?? 0}`,
            ...notices.values()
          ].join('\n');
  }
}

export function describe(status: IStatus): string {
  if (status.error) {
    return `llfabric: ${status.session}: ${status.error}`;
  }
  if (!status.open) {
    return `llfabric: ${status.session} (not open on ${status.address})`;
  }
  const kind = (status.kind ?? 'gpu').toUpperCase();
  const lease =
    status.lease === 'queued' ? `queued #${status.position}` : `lease ${status.lease}`;
  const share = Math.round(100 * (status.saved_share ?? 0));
  // before its first cell a session has leased nothing, and saved nothing worth a figure
  const saved = status.lease_seconds
    ? ` · ${(status.saved_hours ?? 0).toFixed(3)} ${kind}-h saved (${share}%)`
    : '';
  const pinned = status.pinned ? ' · pinned' : '';
  return `llfabric: ${status.session} · ${status.tier} · ${lease}${saved}${pinned}`;
}
