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
  # Image models on Fashion-MNIST: data parallelism, convolutions split by filters and channels,
  # feature maps split by row bands. (inception-small at --branch-parallel 2 drifts 3.4e-5 here
  # over 30 steps, as its reordered sums do at every layout: tests/train/test_cnn_branch.cpp;
  # with --exact-sums it holds, the test after the loop.)
  foreach(layout "cnn-small;dp" "cnn-small;tp" "cnn-small;spatial")
    list(GET layout 0 model)
    list(GET layout 1 axis)
    add_test(NAME parallel_mpi_${model}_${axis}2
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 2
                     --image ${model} --${axis} 2)
    set_tests_properties(parallel_mpi_${model}_${axis}2 PROPERTIES TIMEOUT 300 LABELS parallel
        PASS_REGULAR_EXPRESSION "MPI PARITY OK")
  endforeach()
  # Exact sums across processes: inception-small's branches on 2 MPI ranks, and resnet-small at
  # dp 2 x pp 2 on 4, each against the single rank with the same --exact-sums (learning rates at
  # which their losses fall by more than 0.5 in the 30 steps).
  add_test(NAME parallel_mpi_inception-small_branch2_exact
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 2
                   --image inception-small --exact 4 --lr 0.1 --branch-parallel 2)
  add_test(NAME parallel_mpi_resnet-small_dp2_pp2_exact
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 4
                   --image resnet-small --exact 4 --lr 0.05 --dp 2 --pp 2)
  set_tests_properties(parallel_mpi_inception-small_branch2_exact parallel_mpi_resnet-small_dp2_pp2_exact
      PROPERTIES TIMEOUT 300 LABELS parallel PASS_REGULAR_EXPRESSION "MPI PARITY OK")
  if(TARGET test_parallel)
    add_dependencies(test_parallel meshtrain)
  endif()
endif()
