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
  error(message: unknown, context?: string) {
    this.lines.push({ level: 'error', message: String(message), context });
  }
  of(context: string, level: string) {
    return this.lines.filter((l) => l.context === context && l.level === level).map((l) => l.message);
  }
  clear() {
    this.lines.length = 0;
  }
}
