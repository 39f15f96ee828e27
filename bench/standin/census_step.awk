# census_step.awk - a step's share of the stand-in runtime's census (KVCHAT_STANDIN_REPORT):
#   awk -v steps=N -f bench/standin/census_step.awk SHORT LONG
# where SHORT and LONG are the reports of two runs that differ only in N more decode steps in LONG.
# Prints "KIND NAME COUNT" for every line whose count differs, COUNT a step (LONG less SHORT, / N).
FNR == 1 { f++ }
{ n[$1 " " $2] += (f == 2 ? $3 : -$3) }
END { for (k in n) if (n[k]) printf "%s %g\n", k, n[k] / steps }
