import type { LoggerService } from '@nestjs/common';

/** Every line logged, by level, with its context: install with `Logger.overrideLogger(recorder)`. */
export class LogRecorder implements LoggerService {
  readonly lines: { level: string; message: string; context?: string }[] = [];
  log(message: unknown, context?: string) {
    this.lines.push({ level: 'log', message: String(message), context });
  }
  warn(message: unknown, context?: string) {
    this.lines.push({ level: 'warn', message: String(message), context });
  }
  /** Nest's Logger passes `(message, stack, context)` for errors: the context is the last parameter. */
  error(message: unknown, ...rest: unknown[]) {
    const context = rest.length > 0 ? rest[rest.length - 1] : undefined;
    this.lines.push({ level: 'error', message: String(message), context: typeof context === 'string' ? context : undefined });
  }
  of(context: string, level: string) {
    return this.lines.filter((l) => l.context === context && l.level === level).map((l) => l.message);
  }
  clear() {
    this.lines.length = 0;
  }
}
