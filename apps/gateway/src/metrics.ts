import { metrics } from '@opentelemetry/api';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';

let exporter: PrometheusExporter | undefined;

/**
 * Starts the OpenTelemetry metrics SDK: a MeterProvider whose reader is a Prometheus exporter, registered
 * as the global provider. Call it before the Nest app is created: RateLimitModule looks the global
 * provider up when the app starts, and records nothing if it is still the API's no-op one. The exporter
 * opens no port of its own (`preventServerStart`): `GET /metrics` (MetricsController) serves it on the
 * app's port. Calling it again answers the same exporter.
 */
export function startMetrics(): PrometheusExporter {
  if (exporter === undefined) {
    exporter = new PrometheusExporter({ preventServerStart: true });
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [exporter] }));
  }
  return exporter;
}

/** The exporter `startMetrics()` created, if it ran. */
export function prometheusExporter(): PrometheusExporter | undefined {
  return exporter;
}
