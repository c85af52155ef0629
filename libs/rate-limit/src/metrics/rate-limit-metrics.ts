import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnModuleDestroy } from '@nestjs/common';
import {
  createNoopMeter,
  metrics,
  type Counter,
  type Histogram,
  type Meter,
  type MeterProvider,
  type ObservableGauge,
  type ObservableResult,
} from '@opentelemetry/api';
import { BucketService } from '../bucket/bucket.service.js';
import { RateLimitEvents, type RateLimitDecisionEvent, type StoreCallEvent } from '../events/rate-limit-events.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import {
  METER_NAME,
  NEAR_LIMIT_SHARE,
  RateLimitMetricAttributes as A,
  RateLimitMetricNames as N,
  STORE_DURATION_BUCKETS,
} from './metric-names.js';

/** The instruments, once a real MeterProvider was found. */
interface Instruments {
  decisions: Counter;
  nearLimit: Counter;
  storeDuration: Histogram;
  breakerOpen: ObservableGauge;
  observeBreaker: (result: ObservableResult) => void;
  concurrencyHeld: ObservableGauge;
  observeHeld: (result: ObservableResult) => void;
}

/**
 * Records the limiter's decisions, store calls and breaker state through the OpenTelemetry metrics API.
 *
 * The MeterProvider is looked up once, when the application bootstraps (`app.init()` / `listen()`): the
 * one given in `metrics: { meterProvider }`, else the global one. When that is the API's no-op provider
 * (no SDK registered), nothing subscribes to `RateLimitEvents`, so the request path does not even build
 * the events: no cost without an SDK. Attributes are bounded: policy scope, outcome, source; never an
 * identity or a URL.
 */
@Injectable()
export class RateLimitMetrics implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger('RateLimit');
  private instruments: Instruments | undefined;

  constructor(
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly events: RateLimitEvents,
    private readonly buckets: BucketService,
  ) {}

  /** Whether metrics are being recorded (a MeterProvider of an SDK was found or given). */
  get enabled(): boolean {
    return this.instruments !== undefined;
  }

  onApplicationBootstrap(): void {
    this.start();
  }

  /** The app is closing: the breaker gauge stops reporting it (the MeterProvider may outlive it). */
  onModuleDestroy(): void {
    const instruments = this.instruments;
    if (instruments !== undefined) {
      instruments.breakerOpen.removeCallback(instruments.observeBreaker);
      instruments.concurrencyHeld.removeCallback(instruments.observeHeld);
    }
  }

  private start(): void {
    const setting = this.options.metrics;
    if (setting.mode === 'off' || this.instruments !== undefined) return;
    const provider: MeterProvider = setting.mode === 'provider' ? setting.meterProvider : metrics.getMeterProvider();
    const meter = provider.getMeter(METER_NAME);
    // The API's no-op provider answers its no-op meter (the same object createNoopMeter() gives). The global
    // one is no-op when no SDK registered a provider (or registered it with an older major/minor of the API).
    if (meter === createNoopMeter()) {
      if (setting.mode === 'global' && setting.warn) {
        this.logger.warn(
          'metrics: true, but no OpenTelemetry MeterProvider is registered: nothing is recorded. Start the SDK ' +
            '(metrics.setGlobalMeterProvider) before app.init() / app.listen(), or pass metrics: { meterProvider }',
        );
      }
      return;
    }
    this.instruments = this.record(meter);
  }

  private record(meter: Meter): Instruments {
    const decisions = meter.createCounter(N.decisions, {
      description: 'Rate-limit decisions, one per policy decided',
      unit: '{decision}',
    });
    const nearLimit = meter.createCounter(N.nearLimit, {
      description: `Allowed rate-limit decisions that left less than ${NEAR_LIMIT_SHARE * 100}% of the bucket's capacity`,
      unit: '{decision}',
    });
    const storeDuration = meter.createHistogram(N.storeDuration, {
      description: 'Duration of rate-limit store calls (Redis), timed-out ones included',
      unit: 's',
      advice: { explicitBucketBoundaries: STORE_DURATION_BUCKETS },
    });
    const breakerOpen = meter.createObservableGauge(N.breakerOpen, {
      description: '1 while the rate-limit store keeps failing (the breaker is open and failureMode decides), else 0',
    });
    const observeBreaker = (result: ObservableResult) => result.observe(this.buckets.storeFailing ? 1 : 0);
    breakerOpen.addCallback(observeBreaker);
    const concurrencyDecisions = meter.createCounter(N.concurrencyDecisions, {
      description: 'Concurrency slots asked for by @ConcurrencyLimit routes, allowed or denied',
      unit: '{decision}',
    });
    const concurrencyHeld = meter.createObservableGauge(N.concurrencyHeld, {
      description: 'Concurrency slots this instance holds now',
      unit: '{slot}',
    });
    const observeHeld = (result: ObservableResult) => result.observe(this.buckets.slots.held);
    concurrencyHeld.addCallback(observeHeld);

    this.events.onDecision((event: RateLimitDecisionEvent) => {
      if (event.limiter === 'concurrency') {
        concurrencyDecisions.add(1, { [A.scope]: event.scope, [A.outcome]: event.outcome, [A.source]: event.source });
        return;
      }
      decisions.add(1, { [A.scope]: event.scope, [A.outcome]: event.outcome, [A.source]: event.source });
      if (event.outcome === 'allowed' && event.remaining < event.limit * NEAR_LIMIT_SHARE) {
        nearLimit.add(1, { [A.scope]: event.scope, [A.source]: event.source });
      }
    });
    this.events.onStoreCall((event: StoreCallEvent) => {
      storeDuration.record(event.durationMs / 1000, { [A.storeOutcome]: event.outcome });
    });
    return { decisions, nearLimit, storeDuration, breakerOpen, observeBreaker, concurrencyHeld, observeHeld };
  }
}
