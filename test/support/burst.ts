import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const CLIENT = fileURLToPath(new URL('./burst-client.mjs', import.meta.url));

export interface BurstRequest {
  /** Path without the leading slash. */
  path: string;
  /** Sent as X-Forwarded-For (the app must trust the proxy). */
  ip: string;
}

export interface BurstAnswer {
  path: string;
  status: number;
}

/**
 * Sends `requests` to 127.0.0.1:`port` as one burst from another process: one connection each, all
 * connected first, then all written at once, as many clients of a busy app arrive together. Another
 * process, because a client in the app's own process shares its event loop: its requests would reach
 * the server one per loop turn, never piled up behind a handler that holds the loop.
 */
export function burst(port: number, requests: readonly BurstRequest[]): Promise<BurstAnswer[]> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [CLIENT, String(port), JSON.stringify(requests)], { maxBuffer: 16 << 20 }, (error, stdout) => {
      if (error) reject(error);
      else resolve(JSON.parse(stdout) as BurstAnswer[]);
    });
  });
}

/**
 * Sends each burst of `rounds` as `burst` does, one after the other (each once the one before it was
 * answered), from one process: the rounds of a test without a process start (about 150 ms) each.
 */
export function bursts(port: number, rounds: readonly (readonly BurstRequest[])[]): Promise<BurstAnswer[][]> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [CLIENT, String(port), JSON.stringify(rounds)], { maxBuffer: 16 << 20 }, (error, stdout) => {
      if (error) reject(error);
      else resolve(JSON.parse(stdout) as BurstAnswer[][]);
    });
  });
}
