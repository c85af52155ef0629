/** Redis Cluster's slots, computed here as Redis does, to group a decision's buckets and to find a key's node. */

/** The first `{...}` of a key: what Redis Cluster hashes to pick the slot. */
export function hashTag(key: string): string {
  const open = key.indexOf('{');
  const close = key.indexOf('}', open + 1);
  return open >= 0 && close > open + 1 ? key.slice(open + 1, close) : key;
}

/** The Cluster slot of a hash tag: CRC16 (XMODEM: polynomial 0x1021, initial 0) of its bytes, modulo 16384. */
export function keySlot(tag: string): number {
  let crc = 0;
  for (const byte of Buffer.from(tag, 'utf8')) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc & 0x3fff;
}
