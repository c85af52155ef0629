import type { Attributes } from '@opentelemetry/api';
import {
  AggregationTemporality,
  type DataPoint,
  type Histogram,
  MeterProvider,
  type MetricData,
  MetricReader,
} from '@opentelemetry/sdk-metrics';

/** A reader whose `collect()` the test calls when it wants the numbers (cumulative, as an exporter would see them). */
class OnDemandReader extends MetricReader {
  protected async onShutdown(): Promise<void> {}
  protected async onForceFlush(): Promise<void> {}
}

/** An SDK MeterProvider and what it has recorded, by instrument name. */
export class Recorded {
  readonly reader: OnDemandReader;
  readonly provider: MeterProvider;

  /** `DELTA`: each collect() holds only what was recorded (or observed) since the last one. */
  constructor(temporality = AggregationTemporality.CUMULATIVE) {
    this.reader = new OnDemandReader({ aggregationTemporalitySelector: () => temporality });
    this.provider = new MeterProvider({ readers: [this.reader] });
  }

  /** Every metric the provider holds now, by name. */
  async collect(): Promise<Map<string, MetricData>> {
    const { resourceMetrics, errors } = await this.reader.collect();
    if (errors.length > 0) throw new AggregateError(errors, 'metric collection failed');
    const byName = new Map<string, MetricData>();
    for (const scope of resourceMetrics.scopeMetrics) {
      for (const metric of scope.metrics) byName.set(metric.descriptor.name, metric);
    }
    return byName;
  }

  /** The data points of one metric (none when it was never recorded). */
  async points<T = number>(name: string): Promise<Array<DataPoint<T>>> {
    return ((await this.collect()).get(name)?.dataPoints ?? []) as Array<DataPoint<T>>;
  }

  /** Counter values by attributes, as `{ attributes, value }` sorted by their JSON, for exact comparison. */
  async counts(name: string): Promise<Array<{ attributes: Attributes; value: number }>> {
    return (await this.points<number>(name))
      .map(({ attributes, value }) => ({ attributes, value }))
      .sort((a, b) => JSON.stringify(a.attributes).localeCompare(JSON.stringify(b.attributes)));
  }

  /** Histogram counts by attributes. */
  async histogramCounts(name: string): Promise<Array<{ attributes: Attributes; count: number; sum: number }>> {
    return (await this.points<Histogram>(name)).map(({ attributes, value }) => ({
      attributes,
      count: value.count,
      sum: value.sum ?? 0,
    }));
  }

  shutdown(): Promise<void> {
    return this.provider.shutdown();
  }
}
