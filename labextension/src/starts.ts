// How each cell started on the fabric (the kernel's `started` message, fabric/attach/frontend.py),
// shown beside its prompt where the user turned that on (the `showCellStart` setting): prepared,
// warm, restored or cold, the words `%llfabric status` uses.
import { NotebookPanel } from '@jupyterlab/notebook';

export interface IStarted {
  cell_id: string;
  execution_count: number;
  start: string;
}

// As `%llfabric status` explains them (fabric/attach/magics.py STARTS)
const MEANING: Record<string, string> = {
  prepared: 'on a worker readied while it was edited',
  warm: 'on the worker kept from the cell before',
  restored: 'on a worker brought back from disk',
  cold: 'on a worker started for it'
};

const STYLE = `
.jp-InputPrompt[data-llfabric-start]::after { content: attr(data-llfabric-start); display: block;
  font-family: var(--jp-ui-font-family); font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2); }
`;

// The starts of one notebook's cells, by cell id, shown or not as the setting says.
export class CellStarts {
  constructor(private panel: NotebookPanel) {
    if (document.getElementById('llfabric-starts-style') === null) {
      const style = document.createElement('style');
      style.id = 'llfabric-starts-style';
      style.textContent = STYLE;
      document.head.appendChild(style);
    }
  }

  record(started: IStarted): void {
    if (typeof started.cell_id === 'string' && MEANING[started.start] !== undefined) {
      this._starts.set(started.cell_id, started);
      this.render();
    }
  }

  set shown(shown: boolean) {
    this._shown = shown;
    this.render();
  }

  render(): void {
    for (const cell of this.panel.content.widgets) {
      const prompt = cell.promptNode;
      const started = this._starts.get(cell.model.id);
      if (prompt === null) {
        continue;
      }
      if (this._shown && started !== undefined) {
        prompt.dataset.llfabricStart = started.start;
        const meaning = MEANING[started.start];
        prompt.title = `[${started.execution_count}] started ${started.start}: ${meaning}`;
      } else if (prompt.dataset.llfabricStart !== undefined) {
        delete prompt.dataset.llfabricStart;
        prompt.removeAttribute('title');
      }
    }
  }

  private _starts = new Map<string, IStarted>();
  private _shown = false;
}
