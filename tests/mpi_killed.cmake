# test_mpi's hidden case "[.killed]" under mpirun: rank 1 is killed (SIGKILL) in the middle of a
# run of all_reduces. Open MPI 4.1 has no ULFM, so the job must end (mpirun's nonzero exit) well
# before collx's deadline, with no survivor's wrong sum and no hang (docs/mpi.md).
#   cmake -DMPIEXEC=... -DTEST=... -DNP=3 -DMCA="--mca;pml;ob1;--mca;btl;self,vader" -P mpi_killed.cmake
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} -np ${NP} ${MCA} ${TEST} --use-colour no "[.killed]"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message(STATUS "mpirun: exit ${rc} after ${took} s")
if(out MATCHES "WRONG SUM")
  message(FATAL_ERROR "a survivor returned a wrong sum:\n${out}")
endif()
if(NOT out MATCHES "rank 0: 11 sums right")
  message(FATAL_ERROR "the job did not run its first sums before the kill:\n${out}\n${err}")
endif()
if(rc EQUAL 0 OR rc MATCHES "timeout")
  message(FATAL_ERROR "the job did not end with an error after a rank was killed (exit: ${rc}):\n${out}\n${err}")
endif()
if(took GREATER 60)
  message(FATAL_ERROR "the job took ${took} s to end after a rank was killed")
endif()
