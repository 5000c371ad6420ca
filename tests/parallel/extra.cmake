# Data parallelism across MPI processes (mpirun -np 2) against the single-rank curve.
if(MESHTRAIN_HAVE_MPI)
  find_program(MESHTRAIN_MPIRUN NAMES mpirun mpiexec)
  foreach(zero 0 2)
    add_test(NAME parallel_mpi_dp2_zero${zero}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 2
                     --dp 2 --zero ${zero})
    set_tests_properties(parallel_mpi_dp2_zero${zero} PROPERTIES TIMEOUT 300 LABELS parallel
        PASS_REGULAR_EXPRESSION "MPI PARITY OK")
  endforeach()
  # Image models: data parallelism and convolutions split by filters and channels, Fashion-MNIST.
  foreach(layout "dp;2" "tp;2")
    list(GET layout 0 axis)
    list(GET layout 1 n)
    add_test(NAME parallel_mpi_cnn_${axis}${n}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} ${n}
                     --image cnn-small --${axis} ${n})
    set_tests_properties(parallel_mpi_cnn_${axis}${n} PROPERTIES TIMEOUT 300 LABELS parallel
        PASS_REGULAR_EXPRESSION "MPI PARITY OK")
  endforeach()
  if(TARGET test_parallel)
    add_dependencies(test_parallel meshtrain)
  endif()
endif()
