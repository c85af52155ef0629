import { Agent, get, type IncomingHttpHeaders } from 'node:http';
import { performance } from 'node:perf_hooks';

/** One answer: its status and headers, and when its request was sent and answered (performance.now() ms). */
export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  sentAt: number;
  answeredAt: number;
}

/** GETs over keep-alive connections (a new connection per request would make every decision slow). */
export class Loader {
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 64 });

  /** One GET of `url`. */
  get(url: string): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const sentAt = performance.now();
      const req = get(url, { agent: this.agent }, (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, sentAt, answeredAt: performance.now() }));
      });
      req.on('error', reject);
    });
  }

  /** `total` GETs of `url`, `concurrency` at a time; the answers in order of answer. */
  async load(url: string, total: number, concurrency: number): Promise<Answer[]> {
    const answers: Answer[] = [];
    let next = 0;
    const worker = async () => {
      while (next < total) {
        next++;
        answers.push(await this.get(url));
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    return answers;
  }

  destroy(): void {
    this.agent.destroy();
  }
}

export const count = (answers: readonly Answer[], status: number): number => answers.filter((a) => a.status === status).length;

/** The tokens out on live leases of a bucket hash (the `l:<holder>` fields: "<count>:<end ms>"). */
export function leasedIn(fields: Record<string, string>): number {
  return Object.entries(fields)
    .filter(([field]) => field.startsWith('l:'))
    .reduce((sum, [, value]) => sum + Number(value.split(':')[0]), 0);
}
