import { Controller, Get, NotFoundException, Req, Res } from '@nestjs/common';
import { SkipRateLimit } from 'nest-redis-rate-limit';
import { prometheusExporter } from './metrics.js';

/**
 * `GET /metrics`: the Prometheus text format, written by the OpenTelemetry Prometheus exporter's own
 * request handler on the Node request and response under the platform's (Express's are Node's; Fastify
 * wraps them: `raw`, and `hijack()` tells Fastify the reply is handled). Never rate limited, so a scraper
 * cannot be refused or use up a client's budget.
 */
@Controller('metrics')
@SkipRateLimit()
export class MetricsController {
  @Get()
  metrics(@Req() request: any, @Res() response: any): void {
    const exporter = prometheusExporter();
    if (exporter === undefined) throw new NotFoundException('Metrics are off: main.ts calls startMetrics() before creating the app');
    if (typeof response.hijack === 'function') response.hijack();
    exporter.getMetricsRequestHandler(request.raw ?? request, response.raw ?? response);
  }
}
