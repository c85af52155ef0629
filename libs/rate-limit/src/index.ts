export { RateLimitModule } from './rate-limit.module.js';
export { RATE_LIMIT_OPTIONS, type RateLimitModuleAsyncOptions, type RateLimitOptionsFactory } from './rate-limit.module-definition.js';
export type {
  FailureMode,
  RateLimitAllowList,
  RateLimitAcquireOptions,
  RateLimitKeyOptions,
  RateLimitModuleOptions,
  RateLimitOperationsOptions,
  ResolvedRateLimitOptions,
  StandardHeaders,
} from './rate-limit.options.js';
export type {
  BucketDecision,
  BucketPolicy,
  KeyBy,
  LeaseOption,
  LeaseOptions,
  PolicyNumber,
  PolicyPhase,
  PriorityLevel,
  PriorityOption,
  RateLimitIdentity,
  RateLimitPolicy,
  RateLimitPolicyOptions,
  RateLimitResolver,
  RefundOn,
  ReserveOption,
  ResolvedLimits,
  Verdict,
  VerdictSource,
} from './rate-limit.interfaces.js';
export type { DecisionOutcome, RateLimitDecisionEvent } from './events/rate-limit-events.js';
export { RateLimit } from './decorators/rate-limit.decorator.js';
export { ConcurrencyLimit } from './decorators/concurrency-limit.decorator.js';
export type { ConcurrencyLimitOptions } from './policies/concurrency-option.js';
export type { ConcurrencySlot, SlotSource } from './bucket/concurrency-slots.js';
export type { SlotOptions } from './bucket/slot-options.js';
export type { SlotAnswer, SlotCallOptions, SlotRelease, SlotRequest, SlotStore, SlotTakeResult } from './stores/slots.js';
export { SkipRateLimit } from './decorators/skip-rate-limit.decorator.js';
export { BucketService, type BucketEntry, type PrioritizedPolicy } from './bucket/bucket.service.js';
export { RateLimitHealth, type RateLimitIndicator, type RateLimitStatus } from './operations/rate-limit-health.js';
export { RateLimitInsights, type OperatorChange } from './operations/rate-limit-insights.js';
export { RateLimitDashboardModule } from './dashboard/rate-limit-dashboard.module.js';
export type { RateLimitDashboardOptions } from './dashboard/dashboard.options.js';
export type { OperationsStatus } from './operations/live-operations.js';
export type {
  AuditAction,
  AuditEntry,
  BlockEntry,
  BlockInput,
  BlockTarget,
  IdentityInspection,
  KeyedIdentity,
  OverrideEntry,
  OverrideInput,
  PolicyView,
  SeriesPoint,
  TopIdentity,
} from './operations/operations.types.js';
export type { AcquireOptions } from './bucket/acquire-options.js';
export type { AcquireDecision } from './bucket/waiting-room.js';
export { Paced, type PacedOptions } from './decorators/paced.decorator.js';
export { RateLimitGuard } from './guards/rate-limit.guard.js';
export { RateLimitInterceptor } from './interceptors/rate-limit.interceptor.js';
export type { RateLimitState } from './pipeline/request-state.js';
export type { CompiledPolicy } from './policies/policy.js';
export type { RouteIdentity } from './keys/identity-keys.js';
export { RateLimitMetrics } from './metrics/rate-limit-metrics.js';
export { METER_NAME, RateLimitMetricAttributes, RateLimitMetricNames } from './metrics/metric-names.js';
export {
  RateLimitException,
  RateLimitedGraphQLError,
  type RateLimitedExtensions,
  type RateLimitedPayload,
} from './rate-limit.exception.js';
export {
  RateLimitConfigError,
  RateLimitError,
  RateLimitInputError,
  RateLimitTimeoutError,
  RateLimitUnavailableError,
  RateLimitWaitTooLongError,
  RateLimitConcurrencyError,
} from './errors/rate-limit.errors.js';
export { RATE_LIMIT_ERROR_CODES, type RateLimitErrorCode } from './errors/error-codes.js';
export { RateLimitedEventDropped } from './pipeline/refusals.js';
export {
  BucketStore,
  type ReservationMark,
  type ReserveOptions,
  type TakeResult,
  type TakeOptions,
} from './stores/bucket-store.interface.js';
export type { BucketRequest, PenaltyReport } from './stores/token-bucket.js';
export { MemoryBucketStore, type MemoryBucketStoreOptions } from './stores/memory/memory-bucket.store.js';
export { RedisBucketStore } from './stores/redis/redis-bucket.store.js';
export { redisAnswers } from './stores/redis/redis-probe.js';
export { RATE_LIMIT_POLICIES, RATE_LIMIT_SKIP, RATE_LIMIT_VERDICT } from './rate-limit.constants.js';
export { ConnectionRateLimit, type ConnectionRateLimitOptions } from './contexts/connection-rate-limit.js';
