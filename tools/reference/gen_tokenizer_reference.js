// Writes the tokenizer tests' reference data with the gpt-3-encoder npm package's own encoder
// (run by tools/reference/gen_tokenizer_reference.sh, which installs the package). Arguments:
//   node gen_tokenizer_reference.js PACKAGE_DIR FORTUNES_DIR OUT_DIR
// Writes into OUT_DIR:
//   adversarial.txt           hard Unicode text (written here, so this script is its source)
//   adversarial.ids           its ids, one per line
//   invalid_utf8.txt          text with ill-formed UTF-8 byte sequences
//   invalid_utf8.replaced.ids its ids after WHATWG TextDecoder's U+FFFD substitution
//   fortunes.llmc.gz          the llm.c token file `stp tokenize` must write for FORTUNES_DIR's
//                             text files (no extension), each encoded alone, in name order
//   fortunes.sha256           sha256 of those files' bytes concatenated, to detect another version
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const crypto = require('crypto');

const [pkg, fortunesDir, out] = process.argv.slice(2);
const { encode, decode } = require(path.join(pkg, 'Encoder.js'));

const adversarial = [
  'Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇩🇪🇯🇵 regional, 1️⃣ keycap, ❤️‍🔥 heart.',
  'Combining: e\u0301 a\u0308 n\u0303 Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036b',
  'g\u030c\u0317\u035a\u031a o\u0319\u0314\u036e\u0307\u0350\u0307 \u1100\u1161\u11a8 (jamo) नमस्ते मरहबा مرحبا بالعالم שָׁלוֹם สวัสดีครับ',
  'CJK: 日本語のテキスト、カタカナ。中文文本，繁體字。한국어 텍스트입니다. 𠀀𠀁 (ext B)',
  'Astral letters 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and digits 𝟙𝟚𝟛; Gothic 𐌰𐌱𐌲.',
  'Whitespace:   three, \t\ttabs,\u00a0nbsp,\u3000ideographic,\u2002en\u2003em,\u2028line\u2029para.',
  'Runs:' + ' '.repeat(40) + 'x' + '\t'.repeat(7) + '\n\n\n' + '   \n  \r\n\r\n' + '    ',
  'trailing spaces   ',
  '',
  'Numbers: 0 7 42 1234567890 3.14159 -2.5e10 1,000,000 ١٢٣٤ ²³ ½ ⅞ Ⅻ ⑳ 2024-05-20 10:45pm #1 $9.99 100%',
  "Contractions: I'm you're we've they'll he'd it's don't can't DON'T I'M WE'LL 'quoted' rock'n'roll o'clock",
  "'s 't 're 've 'm 'll 'd ''s '''",
  'Punctuation: ...!!!??? --- *** ### @@@ ~~~ ((())) [[]] {{}} <<>> «» „“ ‘’ — – … • ·',
  'Code: int main() { return x->y[0] + 0x1F; } // comment\n\tif (a != b && c <= d) { s += "\\n"; }',
  'URL: https://example.com/path?query=1&b=%20#frag user@example.org',
  'Long letters: ' + 'abcdefghij'.repeat(300),
  'Long digits: ' + '9'.repeat(500),
  'Long punctuation: ' + '!?'.repeat(400),
  'Mixed scripts: Ελληνικά Кириллица Հայերեն ქართული አማርኛ ᏣᎳᎩ ꦧꦱꦗꦮ',
  'Control: \u0001\u0002\u0007\u001b[0m\u007f end',
  'ZWJ/ZWNJ: a\u200db\u200cc\u2060d \u200b zero width',
  'Private use: \ue000\uf8ff and noncharacter-adjacent \ufffd replacement',
  '',
].join('\n');
fs.writeFileSync(path.join(out, 'adversarial.txt'), adversarial);
const adv = encode(adversarial);
if (decode(adv) !== adversarial) throw new Error('the reference does not round-trip adversarial.txt');
fs.writeFileSync(path.join(out, 'adversarial.ids'), adv.join('\n') + '\n');

// Ill-formed UTF-8: a lone continuation byte, a truncated 3-byte sequence, an overlong '/', a
// surrogate, a byte above F4, a sequence cut by the end of the file.
const invalid = Buffer.concat([
  Buffer.from('valid start '), Buffer.from([0x80]), Buffer.from(' lone continuation, '),
  Buffer.from([0xe2, 0x82]), Buffer.from(' truncated euro, '), Buffer.from([0xc0, 0xaf]),
  Buffer.from(' overlong, '), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from(' surrogate, '),
  Buffer.from([0xf5, 0x80]), Buffer.from(' above F4, ok é, end '), Buffer.from([0xf0, 0x9f, 0x98]),
]);
fs.writeFileSync(path.join(out, 'invalid_utf8.txt'), invalid);
const replaced = new TextDecoder('utf-8').decode(invalid);  // WHATWG: U+FFFD per maximal subpart
fs.writeFileSync(path.join(out, 'invalid_utf8.replaced.ids'), encode(replaced).join('\n') + '\n');

const files = fs.readdirSync(fortunesDir).filter(f => !f.includes('.')).sort()
  .map(f => path.join(fortunesDir, f)).filter(f => fs.lstatSync(f).isFile());
const hash = crypto.createHash('sha256');
const ids = [];
for (const f of files) {
  const bytes = fs.readFileSync(f);
  hash.update(bytes);
  const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  const e = encode(text);
  if (decode(e) !== text) throw new Error('the reference does not round-trip ' + f);
  for (const id of e) ids.push(id);
}
const header = Buffer.alloc(256 * 4);
header.writeInt32LE(20240520, 0);
header.writeInt32LE(1, 4);
header.writeInt32LE(ids.length, 8);
const body = Buffer.alloc(2 * ids.length);
ids.forEach((id, i) => body.writeUInt16LE(id, 2 * i));
fs.writeFileSync(path.join(out, 'fortunes.llmc.gz'), zlib.gzipSync(Buffer.concat([header, body]), { level: 9 }));
fs.writeFileSync(path.join(out, 'fortunes.sha256'), hash.digest('hex') + '\n');
console.log(`adversarial: ${adv.length} ids; fortunes: ${files.length} files, ${ids.length} ids`);
