# Ruby workload for the LD_PRELOAD tests: strings, hashes, arrays and threads, checked by the test's own arithmetic.
N = 200_000

h = {}
N.times { |i| h["key-#{i}"] = "v" * (i % 100) + i.to_s }
value_bytes = h.each_value.sum(&:bytesize)

# Grow one string by appends (reallocations), then split it back.
s = +""
20_000.times { |i| s << "item#{i}," }
parts = s.split(",")

threads = 4.times.map do |k|
  Thread.new do
    a = []
    50_000.times { |i| a << (i * (k + 1)).to_s * 2 }
    a.map(&:bytesize).sum
  end
end
thread_bytes = threads.map(&:value).sum

h.delete_if { |key, _| key.end_with?("7") }
GC.start
puts "keys=#{h.size} value_bytes=#{value_bytes} parts=#{parts.size} joined=#{s.bytesize} thread_bytes=#{thread_bytes}"
